"""What discovery reports about a node's GPUs, independent of the vendor library that found them.

Backends (NVML, the fake file) produce `DeviceInfo`; the rest of the agent only sees these dataclasses and
converts them to `gpupool.core.model.GPU` at the edge (`to_gpu`). A new vendor is one new backend that
fills the same fields and sets `vendor`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from gpupool.core.model import GPU

_VERSION = re.compile(r"^(\d+)\.(\d+)")


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    uuid: str
    index: int
    model: str
    memory_mib: int
    pci_bus_id: str = ""
    numa_node: int = -1  # -1: unknown (single-socket machines often report it so)
    sm_count: int = 0
    nvlink_peers: tuple[int, ...] = ()  # indices of GPUs joined to this one by NVLink
    mig_enabled: bool = False
    vendor: str = "nvidia"
    compute_capability: str = ""  # "major.minor" (e.g. "9.0"); "" when the driver did not say

    def to_gpu(self, healthy: bool = True) -> GPU:
        return GPU(
            uuid=self.uuid,
            index=self.index,
            model=self.model,
            memory_mib=self.memory_mib,
            sm_count=self.sm_count,
            numa_node=max(self.numa_node, 0),
            nvlink_peers=self.nvlink_peers,
            vendor=self.vendor,
            healthy=healthy,
        )


@dataclass(frozen=True, slots=True)
class Discovered:
    """One discovery pass: the devices in index order plus the software versions next to them."""

    vendor: str
    driver_version: str
    cuda_version: str
    devices: tuple[DeviceInfo, ...]

    def nvlink_matrix(self) -> list[list[bool]]:
        """Pairwise NVLink connectivity by index (symmetric)."""
        n = len(self.devices)
        matrix = [[False] * n for _ in range(n)]
        for d in self.devices:
            for peer in d.nvlink_peers:
                if 0 <= peer < n:
                    matrix[d.index][peer] = matrix[peer][d.index] = True
        return matrix


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """A device error reported by the driver. `uuid` None means it could not be tied to one device."""

    uuid: str | None
    xid: int
    detail: str = ""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding a context on a GPU, as the driver reports it from the host."""

    pid: int  # host PID (the driver never reports PIDs of a container's own namespace)
    used_memory_mib: float  # GPU memory the process holds (allocations and context); 0 when not reported


@dataclass(frozen=True, slots=True)
class UtilizationSample:
    """One per-process utilisation sample of a GPU: the SM share the process used over the sample period."""

    pid: int  # host PID
    timestamp_us: int  # the driver's time stamp (microseconds); only its order matters
    sm_percent: float


class DiscoveryBackend(Protocol):
    """A source of GPUs. Calls may block (NVML is synchronous); the agent runs them off the event loop."""

    name: str

    def discover(self) -> Discovered:
        """Enumerate the GPUs now. Raises DiscoveryError when the library cannot be used at all."""
        ...

    def probe(self, uuid: str) -> str | None:
        """Check one GPU: None when it answers normally, else why not."""
        ...

    def wait_event(self, timeout_s: float) -> HealthEvent | None:
        """Block up to `timeout_s` for the next device error; None when none came."""
        ...

    def processes(self, uuid: str) -> tuple[GpuProcess, ...]:
        """The processes holding GPU memory on `uuid` now. Raises DiscoveryError when it cannot be asked."""
        ...

    def process_utilization(self, uuid: str, since_us: int) -> tuple[UtilizationSample, ...]:
        """Per-process samples of `uuid` newer than `since_us` (0: whatever the driver still holds)."""
        ...

    def close(self) -> None: ...


class DiscoveryError(RuntimeError):
    """Discovery cannot run (no driver, unreadable fake file); the message says what and where."""


def driver_version(text: str) -> tuple[int, int] | None:
    """(major, minor) of a driver version such as 570.86.15; None when it is not one."""
    m = _VERSION.match(text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None
