"""AMD partitions and Ascend vNPUs carved for claims by the MIG manager (issue 40).

The MIG manager (gpupool.agent.devices.mig.MigManager) already has what carving a vendor's partitions needs:
every step written to its checkpoint before it is taken, `reconcile` with the card at start, nothing held by
a pod or claim ever destroyed (and the vendor's IN_USE answer respected), idle partitions destroyed after
`mig_idle_after_s`. So the vendors' partitions are not given a second manager: `PartitionMigBackend` makes a
vendor's `PartitionBackend` (AmdPartitions, AscendPartitions: gpupool.agent.devices.vendor) look like the MIG
driver the manager drives, and the manager plans with the card's geometry from gpupool.core.geometry.

The mapping: a partition is a GPU instance whose id is its start (unique on a card: an AMD partition's
first XCC, an Ascend vNPU's index) and whose "compute instance" is the partition itself, so its MIG-UUID
slot holds the vendor's partition id (an AMD partition's processor UUID, a vNPU id). Creating the GPU
instance carves the partition; creating the compute instance only reads the id back, so a crash between
the two leaves a partition reconcile finds whole. Destroying the compute instance does nothing; destroying
the GPU instance destroys the partition (on AMD: releases it, the card leaving its mode once all are).

Which cards are published and planned as partitions ("in partition mode", the analog of MIG mode): a card
of a partitionable model that has partitions now, and every such card where the node's label
`gpupool.io/mig-mode-switch=allowed` lets the agent partition idle cards. Others stay whole cards and shares.
"""

from __future__ import annotations

from typing import Any

from gpupool.agent.devices.discovery import DeviceInfo, DiscoveryBackend, DiscoveryError
from gpupool.agent.devices.mig import BackendInstance, MigError
from gpupool.agent.devices.vendor import Partition, PartitionBackend, PartitionError
from gpupool.api.allocation import GrantDoc, MigGrantDoc
from gpupool.core.geometry import vendor_model, vendor_share
from gpupool.core.model import MigSlot


class PartitionMigBackend:
    """A vendor's PartitionBackend as the MIG manager's MigBackend (module docstring: the mapping)."""

    def __init__(self, discovery: DiscoveryBackend, partitions: PartitionBackend, partition_mode: bool = False) -> None:
        self.discovery = discovery
        self.backend = partitions
        self.partition_mode = partition_mode  # the node's label lets the agent partition idle cards

    def _devices(self) -> dict[str, DeviceInfo]:
        try:
            found = self.discovery.discover().devices
        except DiscoveryError as e:
            raise MigError("NOT_FOUND", f"the cards cannot be listed: {e}") from None
        return {d.uuid: d for d in found if vendor_model(d.model) is not None}

    def gpu_uuids(self) -> list[str]:
        """The node's cards of a model gpupool has partition geometry for."""
        return sorted(self._devices())

    def model(self, gpu: str) -> str:
        d = self._devices().get(gpu)
        if d is None:
            raise MigError("NOT_FOUND", f"no partitionable card {gpu} on this node")
        return d.model

    def _call(self, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except PartitionError as e:  # the vendor's codes are NVML's names (IN_USE, ...): the manager reads them
            raise MigError(e.code, str(e).split(": ", 1)[-1]) from None

    def mig_enabled(self, gpu: str) -> bool:
        """In partition mode: the label allows partitioning, or the card has partitions now."""
        return self.partition_mode or bool(self._call(self.backend.partitions, gpu))

    def busy(self, gpu: str) -> bool:
        return bool(self._call(self.backend.busy, gpu))

    def set_mig_mode(self, gpu: str, enabled: bool) -> None:
        """Nothing to switch: a partitionable card takes its mode from the partition carved (AMD) or carves
        vNPUs beside its work (Ascend)."""

    def instances(self, gpu: str) -> list[BackendInstance]:
        return [BackendInstance(p.start, p.profile, p.start, p.partition_id)
                for p in self._call(self.backend.partitions, gpu)]

    def partition(self, gpu: str, start: int) -> Partition | None:
        """The partition at `start` of the card now (what a container is handed for it), None when none."""
        return next((p for p in self._call(self.backend.partitions, gpu) if p.start == start), None)

    def create_gpu_instance(self, gpu: str, profile: str, start: int) -> int:
        made: Partition = self._call(self.backend.create, gpu, profile, start)
        return made.start

    def create_compute_instance(self, gpu: str, gi_id: int) -> str:
        found = self.partition(gpu, gi_id)
        if found is None:
            raise MigError("NOT_FOUND", f"{gpu} shows no partition at {gi_id}")
        return found.partition_id

    def destroy_compute_instance(self, gpu: str, gi_id: int) -> None:
        """The partition is its own compute instance: nothing to do before destroying it."""

    def destroy_gpu_instance(self, gpu: str, gi_id: int) -> None:
        found = self.partition(gpu, gi_id)
        if found is None:
            raise MigError("NOT_FOUND", f"{gpu} shows no partition at {gi_id}")
        self._call(self.backend.destroy, gpu, found.partition_id)


def vendor_partitions(source: object) -> PartitionBackend | None:
    """The PartitionBackend of an AMD or Ascend discovery backend (`gpupool agent --backend amdsmi|dcmi`), None
    for any other backend. Imported lazily: a node loads only its own vendor's library."""
    from gpupool.agent.devices.amd import AmdBackend, AmdPartitions
    from gpupool.agent.devices.ascend import AscendBackend, AscendPartitions

    if isinstance(source, AmdBackend):
        return AmdPartitions(source)
    if isinstance(source, AscendBackend):
        return AscendPartitions(source)
    return None


def vendor_partition_grant(dev: DeviceInfo, slot: MigSlot) -> GrantDoc | str:
    """The grant of an AMD partition or Ascend vNPU `slot` of card `dev` (a claim's partition device), or why
    the card cannot serve it: the partition's share of the card as the scheduler counts it
    (gpupool.core.geometry.vendor_share), and the partition it names."""
    model = vendor_model(dev.model)
    if model is None:
        return f"card model {dev.model} has no partition geometry in gpupool"
    profile = model.profile(slot.profile)
    starts = profile.starts if profile is not None and profile.starts else range(model.max_partitions)
    if profile is None or slot.start not in starts:
        return f"{model.name} has no partition {slot.profile} at {slot.start}"
    milli, memory = vendor_share(model, profile, dev.memory_mib)
    return GrantDoc(uuid=dev.uuid, index=dev.index, memory_mib=memory, cores=milli / 10,
                    mig=MigGrantDoc(profile=slot.profile, start=slot.start))
