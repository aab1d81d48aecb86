"""The NVML adapter's conversion logic, driven by a stand-in `pynvml` module object (no GPU here).

The stand-in mimics nvidia-ml-py's shapes: NVMLError subclasses, bytes or str results depending on the
version, ctypes-like structs with attributes, missing functions in older versions."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gpupool.agent.devices.discovery import DiscoveryError
from gpupool.agent.devices.nvml import NvmlBackend, cuda_version_text, normalise_bus_id


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's spelling
    pass


class NVMLError_Timeout(NVMLError):  # noqa: N801
    pass


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    pass


class FakePynvml:
    """Three GPUs: 0 and 1 joined by NVLink; GPU 2 on NUMA node 1, MIG enabled, no NUMA function."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Timeout = NVMLError_Timeout
    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_P2P_STATUS_OK = 0
    nvmlEventTypeXidCriticalError = 0x8

    def __init__(self, as_bytes: bool = False) -> None:
        self.as_bytes = as_bytes
        self.gpus = [
            {
                "uuid": "GPU-11111111-0000",
                "name": "NVIDIA H100 80GB HBM3",
                "total": 81559 * 2**20,
                "bus": "00000000:3B:00.0",
                "numa": 0,
                "mig": [0, 0],
                "sms": 132,
            },
            {
                "uuid": "GPU-22222222-0000",
                "name": "NVIDIA H100 80GB HBM3",
                "total": 81559 * 2**20,
                "bus": "00000000:5E:00.0",
                "numa": 0,
                "mig": [0, 0],
                "sms": 132,
            },
            {
                "uuid": "GPU-33333333-0000",
                "name": "NVIDIA A100-SXM4-40GB",
                "total": 40960 * 2**20,
                "bus": "00000001:AF:00.0",
                "numa": 1,
                "mig": [1, 1],
                "sms": 108,
            },
        ]
        self.lost: set[int] = set()
        self.events: list[Any] = []
        self.registered: list[tuple[int, int]] = []
        self.shutdown = False

    def _s(self, text: str) -> str | bytes:
        return text.encode() if self.as_bytes else text

    def _check(self, h: int) -> None:
        if h in self.lost:
            raise NVMLError_GpuIsLost("GPU is lost")

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        return self._s("570.86.15")

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12080

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        for i, g in enumerate(self.gpus):
            if g["uuid"] == uuid:
                return i
        raise NVMLError("Not Found")

    def nvmlDeviceGetUUID(self, h: int) -> str | bytes:
        return self._s(self.gpus[h]["uuid"])

    def nvmlDeviceGetName(self, h: int) -> str | bytes:
        return self._s(self.gpus[h]["name"])

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        self._check(h)
        return SimpleNamespace(total=self.gpus[h]["total"], free=0, used=0)

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        self._check(h)
        return SimpleNamespace(busId=self._s(self.gpus[h]["bus"]))

    def nvmlDeviceGetNumaNodeId(self, h: int) -> int:
        return int(self.gpus[h]["numa"])

    def nvmlDeviceGetAttributes(self, h: int) -> Any:
        return SimpleNamespace(multiprocessorCount=self.gpus[h]["sms"])

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        if h == 0:
            raise NVMLError_NotSupported("Not Supported")
        return list(self.gpus[h]["mig"])

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        assert index == 2
        if 2 in (a, b):
            raise NVMLError_NotSupported("Not Supported")
        return 0 if {a, b} == {0, 1} else 1

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceGetSupportedEventTypes(self, h: int) -> int:
        return 0x8 | 0x2 if h != 2 else 0x2  # GPU 2 cannot report Xids

    def nvmlDeviceRegisterEvents(self, h: int, mask: int, es: str) -> None:
        self.registered.append((h, mask))

    def nvmlEventSetWait(self, es: str, timeout_ms: int) -> Any:
        if not self.events:
            raise NVMLError_Timeout("Timeout")
        event = self.events.pop(0)
        if isinstance(event, Exception):
            raise event
        return event

    def nvmlEventSetFree(self, es: str) -> None: ...


@pytest.mark.parametrize("as_bytes", [False, True])
def test_discovery_converts_nvml_answers(as_bytes: bool) -> None:
    nvml = FakePynvml(as_bytes=as_bytes)
    found = NvmlBackend(nvml=nvml).discover()
    assert (found.vendor, found.driver_version, found.cuda_version) == ("nvidia", "570.86.15", "12.8")
    d0, d1, d2 = found.devices
    assert (d0.uuid, d0.index, d0.model, d0.memory_mib) == ("GPU-11111111-0000", 0, "NVIDIA H100 80GB HBM3", 81559)
    assert d0.pci_bus_id == "0000:3b:00.0" and d2.pci_bus_id == "0001:af:00.0"
    assert (d0.nvlink_peers, d1.nvlink_peers, d2.nvlink_peers) == ((1,), (0,), ())
    assert [d.numa_node for d in found.devices] == [0, 0, 1]
    assert [d.mig_enabled for d in found.devices] == [False, False, True]  # GPU 0: NotSupported -> False
    assert d2.sm_count == 108
    gpu = d2.to_gpu(healthy=False)
    assert (gpu.uuid, gpu.memory_mib, gpu.numa_node, gpu.healthy) == ("GPU-33333333-0000", 40960, 1, False)
    # Xid events registered only where supported, with only the Xid bit
    assert nvml.registered == [(0, 0x8), (1, 0x8)]


def test_numa_falls_back_to_sysfs_when_nvml_lacks_it() -> None:
    asked: list[str] = []

    def reader(bus: str) -> int:
        asked.append(bus)
        return 1 if bus.startswith("0001") else -1

    full = FakePynvml()
    # an nvidia-ml-py older than 13.x: the module has no nvmlDeviceGetNumaNodeId at all
    old = SimpleNamespace(
        **{k: getattr(full, k) for k in dir(full) if not k.startswith("_") and k != "nvmlDeviceGetNumaNodeId"}
    )
    found = NvmlBackend(nvml=old, numa_reader=reader).discover()
    assert asked == ["0000:3b:00.0", "0000:5e:00.0", "0001:af:00.0"]
    assert [d.numa_node for d in found.devices] == [-1, -1, 1]
    assert found.devices[0].to_gpu().numa_node == 0  # unknown maps to 0 in the core model


def test_events_probe_and_close() -> None:
    nvml = FakePynvml()
    backend = NvmlBackend(nvml=nvml)
    backend.discover()
    assert backend.wait_event(0.01) is None  # NVML timeout
    nvml.events.append(SimpleNamespace(device=1, eventType=0x8, eventData=79))
    event = backend.wait_event(0.01)
    assert event is not None and (event.uuid, event.xid) == ("GPU-22222222-0000", 79)
    nvml.events.append(NVMLError("Unknown Error"))
    broken = backend.wait_event(0.01)
    assert broken is not None and broken.uuid is None and "event wait failed" in broken.detail
    assert backend.probe("GPU-33333333-0000") is None
    nvml.lost.add(2)
    assert "GPU is lost" in (backend.probe("GPU-33333333-0000") or "")
    assert "Not Found" in (backend.probe("GPU-nope") or "")
    backend.close()
    assert nvml.shutdown


def test_init_failure_is_a_discovery_error() -> None:
    nvml = FakePynvml()

    def fail() -> None:
        raise NVMLError("Driver Not Loaded")

    nvml.nvmlInit = fail  # type: ignore[method-assign]
    with pytest.raises(DiscoveryError, match="NVML cannot start.*Driver Not Loaded"):
        NvmlBackend(nvml=nvml)


def test_helpers() -> None:
    assert normalise_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalise_bus_id("0000:3b:00.0") == "0000:3b:00.0"
    assert cuda_version_text(12040) == "12.4" and cuda_version_text(11080) == "11.8"
