"""The vendor seam: everything the node agent needs of one GPU vendor, behind one interface (issue 40).

A vendor is four things the agent asks for, each answered in vendor-neutral dataclasses:
- discovery and health: a `DiscoveryBackend` (discovery.py) whose `DeviceInfo.vendor` names the vendor;
- partitions, the vendor's hardware split of one card (NVIDIA MIG instances, AMD compute x memory partition
  modes, Ascend vNPU templates): a `PartitionBackend`, or None where the cards have none;
- the isolation modes the vendor can hold a share to (`IsolationMode`);
- what a container is handed for a device: device nodes and environment (`ContainerDevices`).

Above the agent, vendors are data only: `gpupool.core.vendors` says which runtime each vendor's cards run
(cuda, rocm, cann) and the scheduler, ledger, queues and simulator see `GPU.vendor` and the model's geometry,
never a vendor library. A new vendor is one module in this room implementing `Vendor`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpupool.agent.devices.discovery import DeviceInfo, DiscoveryBackend
from gpupool.api.isolation import IsolationMode


@dataclass(frozen=True, slots=True)
class Partition:
    """One hardware partition of a card as the vendor library reports it.

    `profile` is the vendor's name for its shape (a MIG profile such as "3g.40gb", an AMD compute mode such as
    "CPX" with its memory mode "NPS4" as "CPX/NPS4", an Ascend template such as "vir08"); `start` is its first
    slot in the geometry `gpupool.core` plans with, so the scheduler's plan and the card's state compare.
    """

    gpu_uuid: str  # the card the partition is carved from
    partition_id: str  # the vendor's id of the partition (MIG UUID, AMD partition's processor id, vNPU id)
    profile: str
    start: int
    memory_mib: int
    compute_units: int  # SMs, CUs or AI Cores of the partition
    device_nodes: tuple[str, ...] = ()  # what a container is given to use it, where the vendor has nodes per partition


class PartitionError(Exception):
    """The vendor refused a partition operation. `code` is one of: IN_USE (the card runs work and the change
    needs it idle), INSUFFICIENT_RESOURCES (no room at that start), INVALID_ARGUMENT (a profile or start the
    card does not have), NOT_SUPPORTED (the card cannot be partitioned), NOT_FOUND (no such partition)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class PartitionBackend(Protocol):
    """The hardware split of a vendor's cards. Calls may block; the agent runs them off the event loop."""

    def profiles(self, gpu_uuid: str) -> tuple[str, ...]:
        """The partition profiles this card supports, smallest first (empty: none)."""
        ...

    def partitions(self, gpu_uuid: str) -> tuple[Partition, ...]:
        """The partitions carved on the card now, by start."""
        ...

    def busy(self, gpu_uuid: str) -> bool:
        """True when processes run on the card (a change that needs the card idle must wait)."""
        ...

    def create(self, gpu_uuid: str, profile: str, start: int) -> Partition:
        """Carve a partition of `profile` at `start` (raises PartitionError)."""
        ...

    def destroy(self, gpu_uuid: str, partition_id: str) -> None:
        """Remove one partition (raises PartitionError; IN_USE while a process holds it)."""
        ...


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    """What the agent hands a container for one device (through CDI or the device plugin's answer)."""

    device_nodes: tuple[str, ...]  # host paths, mounted at the same path in the container unless renamed
    env: Mapping[str, str] = field(default_factory=dict)
    # host path -> container path where they differ (an Ascend vNPU's /dev/vdavinci<id> is /dev/davinci<id>
    # inside, where the CANN runtime looks)
    renames: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()  # CDI device names the runtime resolves itself (NVIDIA's toolkit, `cdi: true`)

    def container_path(self, host_path: str) -> str:
        return self.renames.get(host_path, host_path)


class Vendor(Protocol):
    """One vendor's cards on a node."""

    name: str  # "nvidia", "amd", "ascend": the value of DeviceInfo.vendor / GPU.vendor
    resource_name: str  # the vendor's own whole-card resource name, e.g. "amd.com/gpu"

    @property
    def discovery(self) -> DiscoveryBackend: ...

    @property
    def partitioning(self) -> PartitionBackend | None: ...

    def isolation_modes(self) -> frozenset[IsolationMode]:
        """The modes a share on this vendor's cards can be held by (IsolationMode.NONE for whole cards)."""
        ...

    def container_devices(self, device: DeviceInfo, partition: Partition | None = None) -> ContainerDevices:
        """The device nodes and environment a container needs for `device` (or one of its partitions)."""
        ...
