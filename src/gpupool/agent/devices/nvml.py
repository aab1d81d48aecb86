"""The NVML discovery backend (adapter for `nvidia-ml-py`, module `pynvml`).

This is the only module that touches pynvml. NVML objects (handles, ctypes structs) are converted to
`DeviceInfo` here and never leave. The module object is injected (`NvmlBackend(nvml=...)`), so tests drive
the conversion logic with a stand-in module; in production it is `import pynvml`.

Not exercised on a real GPU yet (no GPU machine was available when it was written): the call sequence
follows the NVML documentation and nvidia-ml-py 13.x; see docs/agent.md.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from gpupool.agent.devices.discovery import (
    DeviceInfo,
    Discovered,
    DiscoveryError,
    GpuProcess,
    HealthEvent,
    UtilizationSample,
)
from gpupool.agent.devices.mig_nvml import NvmlMigBackend

MIB = 1024 * 1024
_XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError, used when the module lacks the constant
_NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE: usedGpuMemory unknown (no privilege, Windows WDDM)


def _text(value: Any) -> str:
    """pynvml returns bytes before 11.525 and str after."""
    return value.decode() if isinstance(value, bytes) else str(value)


def normalise_bus_id(bus_id: str) -> str:
    """NVML's `00000000:3B:00.0` -> sysfs' `0000:3b:00.0` (4-digit domain, lower case)."""
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep:
        return text
    return f"{domain[-4:].rjust(4, '0')}:{rest}"


def cuda_version_text(version: int) -> str:
    """NVML encodes CUDA 12.4 as 12040."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def _sysfs_numa(bus_id: str) -> int:
    try:
        return int(Path(f"/sys/bus/pci/devices/{bus_id}/numa_node").read_text().strip())
    except (OSError, ValueError):
        return -1


class NvmlBackend:
    name = "nvml"

    def __init__(self, nvml: ModuleType | Any | None = None, numa_reader: Callable[[str], int] = _sysfs_numa) -> None:
        if nvml is None:
            try:
                import pynvml  # the one import of pynvml in gpupool
            except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
                raise DiscoveryError(f"NVML backend needs nvidia-ml-py: {e}") from None
            nvml = pynvml
        self._nvml: Any = nvml
        self._numa_reader = numa_reader
        self._error: type[BaseException] = getattr(nvml, "NVMLError", Exception)
        self._timeout_error: type[BaseException] | None = getattr(nvml, "NVMLError_Timeout", None)
        self._initialised = False
        self._events: Any = None
        self._events_lock = threading.Lock()
        try:
            self._nvml.nvmlInit()
        except self._error as e:
            raise DiscoveryError(f"NVML cannot start (is the NVIDIA driver loaded and visible?): {e}") from None
        self._initialised = True

    # --- discovery ----------------------------------------------------------------------------------------
    def mig_backend(self) -> NvmlMigBackend:
        """MIG through the same NVML session (gpupool.agent.devices.mig_nvml)."""
        return NvmlMigBackend(self._nvml)

    def discover(self) -> Discovered:
        n = self._nvml
        try:
            count = int(n.nvmlDeviceGetCount())
            handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            driver = _text(n.nvmlSystemGetDriverVersion())
        except self._error as e:
            raise DiscoveryError(f"NVML device enumeration failed: {e}") from None
        cuda = self._optional(lambda: cuda_version_text(int(n.nvmlSystemGetCudaDriverVersion())), "")
        peers = self._nvlink_peers(handles)
        devices = tuple(self._device(i, h, peers[i]) for i, h in enumerate(handles))
        self._register_events(handles)
        return Discovered("nvidia", driver, cuda, devices)

    def _device(self, index: int, handle: Any, peers: tuple[int, ...]) -> DeviceInfo:
        n = self._nvml
        try:
            uuid = _text(n.nvmlDeviceGetUUID(handle))
            name = _text(n.nvmlDeviceGetName(handle))
            memory_mib = int(n.nvmlDeviceGetMemoryInfo(handle).total) // MIB
            bus_id = normalise_bus_id(_text(n.nvmlDeviceGetPciInfo(handle).busId))
        except self._error as e:
            raise DiscoveryError(f"NVML could not describe GPU {index}: {e}") from None
        numa = self._optional(lambda: int(n.nvmlDeviceGetNumaNodeId(handle)), None)
        if numa is None:
            numa = self._numa_reader(bus_id)
        sm_count = self._optional(lambda: int(n.nvmlDeviceGetAttributes(handle).multiprocessorCount), 0)
        mig = self._optional(lambda: int(n.nvmlDeviceGetMigMode(handle)[0]) == 1, False)
        capability = self._optional(lambda: "{}.{}".format(*n.nvmlDeviceGetCudaComputeCapability(handle)), "")
        return DeviceInfo(
            uuid=uuid,
            index=index,
            model=name,
            memory_mib=memory_mib,
            pci_bus_id=bus_id,
            numa_node=numa,
            sm_count=sm_count,
            nvlink_peers=peers,
            mig_enabled=mig,
            vendor="nvidia",
            compute_capability=capability,
        )

    def _nvlink_peers(self, handles: list[Any]) -> list[tuple[int, ...]]:
        """Pairs that NVML says can talk peer-to-peer over NVLink (covers NVSwitch systems too)."""
        n = self._nvml
        index = getattr(n, "NVML_P2P_CAPS_INDEX_NVLINK", 2)
        ok = getattr(n, "NVML_P2P_STATUS_OK", 0)
        peers: list[list[int]] = [[] for _ in handles]
        for i in range(len(handles)):
            for j in range(i + 1, len(handles)):
                linked = self._optional(self._p2p_check(handles[i], handles[j], index, ok), False)
                if linked:
                    peers[i].append(j)
                    peers[j].append(i)
        return [tuple(p) for p in peers]

    def _p2p_check(self, a: Any, b: Any, index: int, ok: int) -> Callable[[], bool]:
        return lambda: bool(self._nvml.nvmlDeviceGetP2PStatus(a, b, index) == ok)

    def _optional(self, call: Callable[[], Any], default: Any) -> Any:
        """Fields that some drivers or library versions lack (NotSupported, FunctionNotFound, missing)."""
        try:
            return call()
        except (self._error, AttributeError):
            return default

    # --- health -------------------------------------------------------------------------------------------
    def _register_events(self, handles: list[Any]) -> None:
        n = self._nvml
        with self._events_lock:
            if self._events is not None:
                return
            try:
                events = n.nvmlEventSetCreate()
            except (self._error, AttributeError):
                return  # no event support: health then relies on probes only
            wanted = getattr(n, "nvmlEventTypeXidCriticalError", _XID_CRITICAL)
            for h in handles:
                with contextlib.suppress(self._error):
                    mask = int(n.nvmlDeviceGetSupportedEventTypes(h)) & wanted
                    if mask:
                        n.nvmlDeviceRegisterEvents(h, mask, events)
            self._events = events

    def wait_event(self, timeout_s: float) -> HealthEvent | None:
        n = self._nvml
        events = self._events
        if events is None:
            threading.Event().wait(timeout_s)
            return None
        try:
            event = n.nvmlEventSetWait(events, int(timeout_s * 1000))
        except self._error as e:
            if self._timeout_error is not None and isinstance(e, self._timeout_error):
                return None
            return HealthEvent(None, -1, f"NVML event wait failed: {e}")
        try:
            uuid: str | None = _text(n.nvmlDeviceGetUUID(event.device))
        except self._error:
            uuid = None
        return HealthEvent(uuid, int(event.eventData), f"NVML event type {int(event.eventType):#x}")

    def probe(self, uuid: str) -> str | None:
        n = self._nvml
        try:
            handle = n.nvmlDeviceGetHandleByUUID(uuid)
            n.nvmlDeviceGetMemoryInfo(handle)
            n.nvmlDeviceGetPciInfo(handle)
        except self._error as e:
            return f"NVML probe failed: {e}"
        return None

    # --- processes (the watchdog's view from the host) -----------------------------------------------------
    def _handle(self, uuid: str) -> Any:
        try:
            return self._nvml.nvmlDeviceGetHandleByUUID(uuid)
        except self._error as e:
            raise DiscoveryError(f"NVML cannot find GPU {uuid}: {e}") from None

    def processes(self, uuid: str) -> tuple[GpuProcess, ...]:
        """Compute and graphics contexts of the GPU (a process with both is listed once, with the larger
        figure): host PIDs and the memory each holds."""
        n = self._nvml
        handle = self._handle(uuid)
        held: dict[int, float] = {}
        for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            call = getattr(n, name, None)
            if call is None:
                continue
            try:
                listed = call(handle)
            except self._error as e:
                if name.endswith("GraphicsRunningProcesses"):
                    continue  # not supported on many data-centre GPUs: compute contexts are what matter
                raise DiscoveryError(f"NVML cannot list the processes of GPU {uuid}: {e}") from None
            for p in listed:
                used = getattr(p, "usedGpuMemory", None)
                mib = 0.0 if used is None or int(used) >= _NOT_AVAILABLE else int(used) / MIB
                pid = int(p.pid)
                held[pid] = max(held.get(pid, 0.0), mib)
        return tuple(GpuProcess(pid, mib) for pid, mib in sorted(held.items()))

    def process_utilization(self, uuid: str, since_us: int) -> tuple[UtilizationSample, ...]:
        n = self._nvml
        handle = self._handle(uuid)
        not_found = getattr(n, "NVMLError_NotFound", None)
        try:
            samples = n.nvmlDeviceGetProcessUtilization(handle, int(since_us))
        except self._error as e:
            if not_found is not None and isinstance(e, not_found):
                return ()  # no sample newer than since_us: nothing ran
            raise DiscoveryError(f"NVML cannot sample the processes of GPU {uuid}: {e}") from None
        return tuple(UtilizationSample(int(s.pid), int(s.timeStamp), float(s.smUtil)) for s in samples)

    def close(self) -> None:
        n = self._nvml
        with self._events_lock:
            if self._events is not None:
                with contextlib.suppress(self._error):
                    n.nvmlEventSetFree(self._events)
                self._events = None
        if self._initialised:
            with contextlib.suppress(self._error):
                n.nvmlShutdown()
            self._initialised = False
