"""The node's ResourceSlices (gpupool.api.dra.resource_slices): the devices of its GPUs with their taints,
written when they differ from what the API holds. The DRA driver (gpupool.agent.dra.driver) publishes them
through this mixin."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.discovery import DeviceInfo
from gpupool.agent.devices.mig import MigError, MigManager
from gpupool.agent.devices.partitions import PartitionMigBackend
from gpupool.agent.devices.table import DeviceTable
from gpupool.agent.port import AgentCluster
from gpupool.api.dra import TAINT_NOT_READY, TAINT_UNHEALTHY, SliceDevice, resource_slices
from gpupool.api.times import format_time
from gpupool.cluster.port import NotFound
from gpupool.core.geometry import vendor_model
from gpupool.core.mig import mig_model
from gpupool.core.vendors import PARTITION_XCP

log = logging.getLogger("gpupool.agent.dra")

_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")


class SlicePublishing:
    """The ResourceSlice half of the DRA driver: what it publishes and when."""

    config: AgentConfig
    table: DeviceTable
    cluster: AgentCluster
    wall_clock: Callable[[], float]
    mig: MigManager | None
    remote_server: Callable[[], str]
    _taint_since: dict[tuple[str, str], str]

    # --- the ResourceSlice --------------------------------------------------------------------------------
    def _taints(self, device: DeviceInfo, now: str) -> tuple[tuple[str, str, str], ...]:
        """The device's taints, each with the time it was first seen (kept while it lasts, so an unchanged
        slice compares equal and is not rewritten; a new fault gets a new time)."""
        wanted = []
        fault = self.table.tracker.faults.get(device.uuid)
        if fault is not None:
            wanted.append((TAINT_UNHEALTHY, label_value(fault.reason)))
        if self.table.withheld is not None:
            wanted.append((TAINT_NOT_READY, label_value(self.table.withheld)))
        for key in (TAINT_UNHEALTHY, TAINT_NOT_READY):
            if all(k != key for k, _ in wanted):
                self._taint_since.pop((device.uuid, key), None)
        return tuple((k, v, self._taint_since.setdefault((device.uuid, k), now)) for k, v in wanted)

    def slice_devices(self) -> list[SliceDevice]:
        now = format_time(self.wall_clock())
        known = sorted(self.table.known.values(), key=lambda d: d.index)
        server = self.remote_server()  # shared GPUs only: a remote share is never a MIG partition
        return [SliceDevice(d.index, d.uuid, d.model, d.memory_mib, d.compute_capability, d.numa_node,
                            d.nvlink_peers, mig_model(d.model) is not None, self._taints(d, now),
                            mig_mode=(mig := self._partitioned(d)),
                            remote_server="" if mig else server, mode_in_use=self._mode_in_use(d) if mig else "")
                for d in known]

    def _mode_in_use(self, d: DeviceInfo) -> str:
        """An AMD card's mode while a claim holds (or a carving or destruction is under way on) a partition of
        it: only that mode's partitions are published then (gpupool.api.dra.SliceDevice.mode_in_use)."""
        model = vendor_model(d.model)
        if self.mig is None or model is None or model.kind != PARTITION_XCP:
            return ""
        held = {e.profile for e in self.mig.entries if e.gpu == d.uuid and (e.pod is not None or e.state != "ready")}
        return held.pop() if len(held) == 1 else ""

    def _partitioned(self, d: DeviceInfo) -> bool:
        """Published as its partitions: an NVIDIA GPU in MIG mode, or an AMD / Ascend card in partition mode
        (gpupool.agent.devices.partitions: it has partitions, or the node's label lets the agent carve them),
        while the node's manager carves them."""
        if d.mig_enabled or self.mig is None:
            return d.mig_enabled and self.mig is not None
        backend = self.mig.backend
        if not isinstance(backend, PartitionMigBackend) or vendor_model(d.model) is None:
            return False
        try:
            return backend.mig_enabled(d.uuid)
        except MigError as e:  # the library could not list its partitions now: as the label says
            log.warning("card %s: partitions unknown (%s)", d.uuid, e)
            return backend.partition_mode

    async def publish(self, node_uid: str) -> bool:
        """Write the node's ResourceSlices when they differ from what the API holds (all of them, with the
        next generation: consumers read a pool only from slices of its newest generation); slices the pool
        no longer needs are deleted. True when written."""
        node = self.config.node_name
        wanted = resource_slices(node, node_uid, self.slice_devices(), self.table.discovered.driver_version, 0)
        first = await self.cluster.get_slice(wanted[0]["metadata"]["name"])
        pool = ((first or {}).get("spec") or {}).get("pool") or {}
        had = int(pool.get("resourceSliceCount", 0) or 0)
        existing = [first] + [await self.cluster.get_slice(w["metadata"]["name"]) for w in wanted[1:]]
        pairs = list(zip(existing, wanted, strict=True))
        if had == len(wanted) and all(e is not None and _content(e) == _content(w) for e, w in pairs):
            return False
        generation = max(int((((e or {}).get("spec") or {}).get("pool") or {}).get("generation", 0))
                         for e in existing) + 1
        for e, w in pairs:
            w["spec"]["pool"]["generation"] = generation
            if e is None:
                await self.cluster.create_slice(w)
            else:
                await self.cluster.patch_slice(w["metadata"]["name"], {"spec": {k: w["spec"].get(k) for k in (
                    "pool", "devices", "sharedCounters")}}, str((e.get("metadata") or {}).get("resourceVersion", "")))
        for k in range(len(wanted), had):  # an older generation had more slices (a GPU left MIG mode)
            with contextlib.suppress(NotFound):
                await self.cluster.delete_slice(f"{wanted[0]['metadata']['name']}-{k}")
        log.info("published %d ResourceSlice(s) of node %s (generation %d, %d GPU(s))", len(wanted), node,
                 generation, len(self.table.known))
        return True


def _content(obj: Mapping[str, Any]) -> tuple[Any, Any]:
    spec = obj.get("spec") or {}
    return spec.get("devices") or [], spec.get("sharedCounters") or []


def label_value(text: str) -> str:
    """A taint value (a label value: 63 characters of [A-Za-z0-9_.-], alphanumeric at both ends)."""
    value = _LABEL_VALUE.sub("-", text)[:63].strip("-_.")
    return value or "true"
