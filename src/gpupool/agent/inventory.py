"""Publishing the node's GPUs: annotation `gpupool.io/inventory` (schema in gpupool.api.inventory) and
labels `gpupool.io/gpu.{present,model,count,memory}`.

Written only when the content changes (the `time` field alone never causes a write), and always as a
merge patch of our own keys: other annotations and labels on the node are never replaced.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.agent.devices import DeviceInfo, Discovered
from gpupool.agent.port import AgentCluster, LabelsUnsupported
from gpupool.api.inventory import InventoryError, decode_inventory, encode_inventory
from gpupool.api.names import ANN_INVENTORY, DOMAIN
from gpupool.api.times import format_time

log = logging.getLogger("gpupool.agent.inventory")

LABEL_PRESENT = f"{DOMAIN}/gpu.present"
LABEL_MODEL = f"{DOMAIN}/gpu.model"
LABEL_COUNT = f"{DOMAIN}/gpu.count"
LABEL_MEMORY = f"{DOMAIN}/gpu.memory"  # MiB of one GPU (the smallest, when models are mixed)


def label_value(text: str) -> str:
    """A valid label value: at most 63 of [A-Za-z0-9._-], starting and ending alphanumeric."""
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63]
    return value.strip("-_.")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The content to publish, without the time stamp (equal snapshots mean nothing to write)."""

    annotation_key: str
    labels: dict[str, str]


def _extra(devices: tuple[DeviceInfo, ...]) -> dict[int, dict[str, Any]]:
    return {d.index: {"mig": d.mig_enabled, "pci_bus_id": d.pci_bus_id} for d in devices}


def inventory_text(
    node: str,
    discovered: Discovered,
    unhealthy: Mapping[str, str],
    split: int,
    time: str,
    per_gpu: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """`per_gpu`: further fields by GPU UUID (the MPS daemon's state, the MIG instances)."""
    gpus = [d.to_gpu(healthy=d.uuid not in unhealthy) for d in discovered.devices]
    extra = _extra(discovered.devices)
    for d in discovered.devices:
        extra[d.index].update((per_gpu or {}).get(d.uuid, {}))
    return encode_inventory(node, gpus, split, discovered.driver_version, discovered.cuda_version, time, extra=extra)


def labels_for(discovered: Discovered) -> dict[str, str]:
    devices = discovered.devices
    if not devices:
        return {LABEL_PRESENT: "false", LABEL_COUNT: "0"}
    models = {d.model for d in devices}
    return {
        LABEL_PRESENT: "true",
        LABEL_MODEL: label_value(models.pop()) if len(models) == 1 else "mixed",
        LABEL_COUNT: str(len(devices)),
        LABEL_MEMORY: str(min(d.memory_mib for d in devices)),
    }


class InventoryPublisher:
    def __init__(self, cluster: AgentCluster, node: str, split: int) -> None:
        self.cluster = cluster
        self.node = node
        self.split = split
        self.last: Snapshot | None = None
        self.writes = 0
        self.labels_warned = False

    async def publish(
        self,
        discovered: Discovered,
        unhealthy: Mapping[str, str],
        now: float,
        per_gpu: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> bool:
        """Write the inventory if it differs from what the node carries; True when written."""
        key = inventory_text(self.node, discovered, unhealthy, self.split, time="", per_gpu=per_gpu)
        snapshot = Snapshot(key, labels_for(discovered))
        if snapshot == self.last:
            return False
        node = await self.cluster.get_node(self.node)
        meta = node.get("metadata") or {}
        current_labels = meta.get("labels") or {}
        annotation_same = _same_content((meta.get("annotations") or {}).get(ANN_INVENTORY), key)
        wanted_labels = dict(snapshot.labels)
        if discovered.devices == ():
            wanted_labels.update({LABEL_MODEL: None, LABEL_MEMORY: None})  # type: ignore[dict-item]
        label_changes = {k: v for k, v in wanted_labels.items() if current_labels.get(k) != v}
        wrote = False
        if not annotation_same:
            text = inventory_text(self.node, discovered, unhealthy, self.split, time=format_time(now), per_gpu=per_gpu)
            await self.cluster.patch_node_annotations(self.node, {ANN_INVENTORY: text})
            wrote = True
        if label_changes:
            try:
                await self.cluster.patch_node_labels(self.node, label_changes)
                wrote = True
            except LabelsUnsupported as e:
                if not self.labels_warned:
                    log.warning("%s", e)
                    self.labels_warned = True
        if wrote:
            self.writes += 1
        self.last = snapshot
        return wrote


def _same_content(current: str | None, key: str) -> bool:
    """Whether the node's annotation already says the same, ignoring its time stamp."""
    if not current:
        return False
    try:
        doc = decode_inventory(current)
    except InventoryError:
        return False
    return doc.model_copy(update={"time": ""}).model_dump_json() == decode_inventory(key).model_dump_json()
