"""The NVML adapter's per-process queries (what the watchdog reads), driven by the stand-in `pynvml` of
test_agent_nvml: host PIDs and the memory each holds, per-process utilisation samples since a time stamp."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gpupool.agent.devices.discovery import DiscoveryError, GpuProcess, UtilizationSample
from gpupool.agent.devices.nvml import NvmlBackend
from tests.agent.devices.test_agent_nvml import FakePynvml, NVMLError, NVMLError_NotSupported

MIB = 2**20
GPU = "GPU-11111111-0000"


class NVMLError_NotFound(NVMLError):  # noqa: N801 - pynvml's spelling
    pass


class WithProcesses(FakePynvml):
    NVMLError_NotFound = NVMLError_NotFound

    def __init__(self) -> None:
        super().__init__()
        self.compute: list[Any] = [SimpleNamespace(pid=4242, usedGpuMemory=3 * 1024 * MIB),
                                   SimpleNamespace(pid=4343, usedGpuMemory=None)]  # not reported
        self.graphics: list[Any] | None = [SimpleNamespace(pid=4242, usedGpuMemory=1024 * MIB),
                                           SimpleNamespace(pid=5000, usedGpuMemory=2**64 - 1)]  # NOT_AVAILABLE
        self.samples = [SimpleNamespace(pid=4242, timeStamp=1_000_500, smUtil=40, memUtil=3),
                        SimpleNamespace(pid=4343, timeStamp=1_000_600, smUtil=7, memUtil=0)]
        self.asked_since: list[int] = []

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        self._check(h)
        return self.compute

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[Any]:
        if self.graphics is None:
            raise NVMLError_NotSupported("graphics")
        return self.graphics

    def nvmlDeviceGetProcessUtilization(self, h: int, since: int) -> list[Any]:
        self.asked_since.append(since)
        newer = [s for s in self.samples if s.timeStamp > since]
        if not newer:
            raise NVMLError_NotFound("no samples")
        return newer


def test_processes_are_host_pids_with_the_memory_they_hold_once_each() -> None:
    nvml = WithProcesses()
    backend = NvmlBackend(nvml=nvml)
    # 4242 has a compute and a graphics context: listed once, with the larger figure (3 GiB)
    assert backend.processes(GPU) == (GpuProcess(4242, 3072.0), GpuProcess(4343, 0.0), GpuProcess(5000, 0.0))
    nvml.graphics = None  # most data-centre GPUs: graphics contexts not supported
    assert backend.processes(GPU) == (GpuProcess(4242, 3072.0), GpuProcess(4343, 0.0))


def test_utilisation_samples_since_a_time_stamp_and_none_newer_is_no_samples() -> None:
    nvml = WithProcesses()
    backend = NvmlBackend(nvml=nvml)
    assert backend.process_utilization(GPU, 1_000_550) == (UtilizationSample(4343, 1_000_600, 7.0),)
    assert backend.process_utilization(GPU, 1_000_600) == ()
    assert nvml.asked_since == [1_000_550, 1_000_600]


def test_a_gpu_nvml_cannot_find_or_list_is_a_discovery_error() -> None:
    nvml = WithProcesses()
    backend = NvmlBackend(nvml=nvml)
    with pytest.raises(DiscoveryError, match="cannot find GPU GPU-missing"):
        backend.processes("GPU-missing")

    def broken(h: int) -> list[Any]:
        raise NVMLError("Unknown Error")

    nvml.nvmlDeviceGetComputeRunningProcesses = broken  # type: ignore[method-assign]
    with pytest.raises(DiscoveryError, match="cannot list the processes of GPU"):
        backend.processes(GPU)
