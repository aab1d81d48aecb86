"""Publishing the node's GPUs: annotation `gpupool.io/inventory` (schema in gpupool.api.inventory), the
feature labels (`labels_for`: `gpupool.io/gpu.{present,model,count,memory}`, compute capability, MIG,
driver and CUDA versions, NVLink), the validation labels `gpupool.io/validation.<step>` and the Node
condition `GpupoolReady` (gpupool.agent.state.validation).

Written only when the content changes (the `time` field alone never causes a write), and always as a
merge patch of our own keys: other annotations and labels on the node are never replaced. A label this
agent manages that no longer applies (e.g. the compute capability of a node whose GPUs are gone) is removed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.agent.devices.discovery import DeviceInfo, Discovered, driver_version
from gpupool.agent.port import AgentCluster, LabelsUnsupported, Obj
from gpupool.agent.state import validation as validation_
from gpupool.agent.state.validation import STEPS, Validation
from gpupool.api.inventory import InventoryError, decode_inventory, encode_inventory
from gpupool.api.names import ANN_INVENTORY, DOMAIN
from gpupool.api.times import format_time
from gpupool.cluster.port import Conflict
from gpupool.core.mig import mig_model

log = logging.getLogger("gpupool.agent.inventory")

LABEL_PRESENT = f"{DOMAIN}/gpu.present"
LABEL_MODEL = f"{DOMAIN}/gpu.model"
LABEL_COUNT = f"{DOMAIN}/gpu.count"
LABEL_MEMORY = f"{DOMAIN}/gpu.memory"  # MiB of one GPU (the smallest, when models are mixed)
# As NVIDIA's GPU feature discovery labels, under gpupool.io/ (the lowest value when GPUs differ).
LABEL_COMPUTE_MAJOR = f"{DOMAIN}/gpu.compute.major"
LABEL_COMPUTE_MINOR = f"{DOMAIN}/gpu.compute.minor"
LABEL_MIG_CAPABLE = f"{DOMAIN}/mig.capable"  # some GPU's model has MIG geometry (gpupool.core.mig)
LABEL_MIG_MODE = f"{DOMAIN}/mig.mode"  # enabled | disabled | mixed
LABEL_DRIVER_MAJOR = f"{DOMAIN}/driver.major"
LABEL_DRIVER_MINOR = f"{DOMAIN}/driver.minor"
LABEL_CUDA_MAJOR = f"{DOMAIN}/cuda.major"  # the CUDA version the driver supports
LABEL_CUDA_MINOR = f"{DOMAIN}/cuda.minor"
LABEL_NVLINK = f"{DOMAIN}/nvlink.present"
# Every label this module writes; one missing from what `labels_for` returns is removed from the node.
MANAGED = (
    LABEL_PRESENT, LABEL_MODEL, LABEL_COUNT, LABEL_MEMORY, LABEL_COMPUTE_MAJOR, LABEL_COMPUTE_MINOR,
    LABEL_MIG_CAPABLE, LABEL_MIG_MODE, LABEL_DRIVER_MAJOR, LABEL_DRIVER_MINOR, LABEL_CUDA_MAJOR,
    LABEL_CUDA_MINOR, LABEL_NVLINK, *(validation_.LABEL_PREFIX + step for step in STEPS),
)


def label_value(text: str) -> str:
    """A valid label value: at most 63 of [A-Za-z0-9._-], starting and ending alphanumeric."""
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63]
    return value.strip("-_.")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The content to publish, without the time stamp (equal snapshots mean nothing to write)."""

    annotation_key: str
    labels: dict[str, str]
    condition: validation_.Condition | None


@dataclass(frozen=True, slots=True)
class RemoteView:
    """What the inventory shows of the node's GPU server (gpupool.agent.remote.serving)."""

    server: str = ""  # its advertised address while up
    shares: int = 0


def _extra(devices: tuple[DeviceInfo, ...]) -> dict[int, dict[str, Any]]:
    return {d.index: {"mig": d.mig_enabled, "pci_bus_id": d.pci_bus_id} for d in devices}


def inventory_text(
    node: str,
    discovered: Discovered,
    unhealthy: Mapping[str, str],
    split: int,
    time: str,
    per_gpu: Mapping[str, Mapping[str, Any]] | None = None,
    validation: Validation | None = None,
    remote: RemoteView | None = None,
) -> str:
    """`per_gpu`: further fields by GPU UUID (the MPS daemon's state, the MIG instances); `remote`: the node's
    GPU server for remote shares."""
    gpus = [d.to_gpu(healthy=d.uuid not in unhealthy) for d in discovered.devices]
    extra = _extra(discovered.devices)
    for d in discovered.devices:
        extra[d.index].update((per_gpu or {}).get(d.uuid, {}))
    steps = [] if validation is None else [
        {"step": step, "state": s.state, "reason": s.reason} for step, s in zip(STEPS, validation.steps, strict=True)
    ]
    remote = remote or RemoteView()
    return encode_inventory(node, gpus, split, discovered.driver_version, discovered.cuda_version, time, extra=extra,
                            validation=steps, remote_server=remote.server, remote_shares=remote.shares)


def _major_minor(text: str) -> tuple[int, int] | None:
    return driver_version(text)  # "570.86.15", "12.8", "9.0": the same leading major.minor


def _version_labels(major: str, minor: str, text: str) -> dict[str, str]:
    version = _major_minor(text)
    return {} if version is None else {major: str(version[0]), minor: str(version[1])}


def labels_for(discovered: Discovered, validation: Validation | None = None) -> dict[str, str]:
    """Every label of the node this agent manages (those of MANAGED that apply)."""
    out = {} if validation is None else validation_.labels(validation)
    devices = discovered.devices
    if not devices:
        return {**out, LABEL_PRESENT: "false", LABEL_COUNT: "0"}
    models = {d.model for d in devices}
    mig = {d.mig_enabled for d in devices}
    capabilities = [c for d in devices if (c := _major_minor(d.compute_capability)) is not None]
    out.update({
        LABEL_PRESENT: "true",
        LABEL_MODEL: label_value(next(iter(models))) if len(models) == 1 else "mixed",
        LABEL_COUNT: str(len(devices)),
        LABEL_MEMORY: str(min(d.memory_mib for d in devices)),
        LABEL_MIG_CAPABLE: str(any(mig_model(d.model) is not None for d in devices)).lower(),
        LABEL_MIG_MODE: "mixed" if len(mig) > 1 else ("enabled" if mig == {True} else "disabled"),
        LABEL_NVLINK: str(any(d.nvlink_peers for d in devices)).lower(),
    })
    if len(capabilities) == len(devices):  # only when every GPU said
        low = min(capabilities)
        out.update({LABEL_COMPUTE_MAJOR: str(low[0]), LABEL_COMPUTE_MINOR: str(low[1])})
    out.update(_version_labels(LABEL_DRIVER_MAJOR, LABEL_DRIVER_MINOR, discovered.driver_version))
    out.update(_version_labels(LABEL_CUDA_MAJOR, LABEL_CUDA_MINOR, discovered.cuda_version))
    return out


class InventoryPublisher:
    def __init__(self, cluster: AgentCluster, node: str, split: int) -> None:
        self.cluster = cluster
        self.node = node
        self.split = split
        self.last: Snapshot | None = None
        self.writes = 0
        self.condition_writes = 0
        self.labels_warned = False

    async def publish(
        self,
        discovered: Discovered,
        unhealthy: Mapping[str, str],
        now: float,
        per_gpu: Mapping[str, Mapping[str, Any]] | None = None,
        validation: Validation | None = None,
        remote: RemoteView | None = None,
    ) -> bool:
        """Write the inventory, labels and condition where they differ from what the node carries; True
        when anything was written. `validation` None: an agent run without node validation (no condition,
        no validation labels)."""
        key = inventory_text(self.node, discovered, unhealthy, self.split, time="", per_gpu=per_gpu,
                             validation=validation, remote=remote)
        condition = None if validation is None else validation_.condition(validation)
        snapshot = Snapshot(key, labels_for(discovered, validation), condition)
        if snapshot == self.last:
            return False
        node = await self.cluster.get_node(self.node)
        meta = node.get("metadata") or {}
        current_labels = meta.get("labels") or {}
        annotation_same = _same_content((meta.get("annotations") or {}).get(ANN_INVENTORY), key)
        wanted_labels: dict[str, str | None] = {k: snapshot.labels.get(k) for k in MANAGED}
        label_changes = {k: v for k, v in wanted_labels.items() if current_labels.get(k) != v}
        wrote = False
        if not annotation_same:
            text = inventory_text(self.node, discovered, unhealthy, self.split, time=format_time(now), per_gpu=per_gpu,
                                  validation=validation, remote=remote)
            # each patch returns the node: the condition's write below is conditional on its resourceVersion
            node = await self.cluster.patch_node_annotations(self.node, {ANN_INVENTORY: text})
            wrote = True
        if label_changes:
            try:
                node = await self.cluster.patch_node_labels(self.node, label_changes)
                wrote = True
            except LabelsUnsupported as e:
                if not self.labels_warned:
                    log.warning("%s", e)
                    self.labels_warned = True
        if condition is not None and await self._write_condition(node, condition, now):
            wrote = True
        if wrote:
            self.writes += 1
        self.last = snapshot
        return wrote

    async def _write_condition(self, node: Obj, condition: validation_.Condition, now: float) -> bool:
        """Set `GpupoolReady` unless the node already says the same; kubelet's own conditions are kept (the
        patch is conditional on the node's resourceVersion; on a conflict the node is read again)."""
        for _ in range(5):
            conditions: list[Obj] = list((node.get("status") or {}).get("conditions") or [])
            ours = next((c for c in conditions if c.get("type") == validation_.CONDITION), None)
            if ours is not None and (ours.get("status"), ours.get("reason"), ours.get("message")) == (
                    condition.status, condition.reason, condition.message):
                return False
            stamp = format_time(now)
            since = stamp if ours is None or ours.get("status") != condition.status else \
                ours.get("lastTransitionTime", stamp)
            entry = {"type": validation_.CONDITION, "status": condition.status, "reason": condition.reason,
                     "message": condition.message, "lastHeartbeatTime": stamp, "lastTransitionTime": since}
            rest = [c for c in conditions if c.get("type") != validation_.CONDITION]
            try:
                await self.cluster.patch_node_conditions(self.node, [*rest, entry],
                                                         str(node["metadata"]["resourceVersion"]))
            except Conflict:
                node = await self.cluster.get_node(self.node)
                continue
            self.condition_writes += 1
            return True
        raise Conflict(f"node {self.node}: condition {validation_.CONDITION} kept meeting conflicts")


def _same_content(current: str | None, key: str) -> bool:
    """Whether the node's annotation already says the same, ignoring its time stamp."""
    if not current:
        return False
    try:
        doc = decode_inventory(current)
    except InventoryError:
        return False
    return doc.model_copy(update={"time": ""}).model_dump_json() == decode_inventory(key).model_dump_json()
