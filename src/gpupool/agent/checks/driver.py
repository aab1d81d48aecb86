"""Validation step `driver`: the driver answers (discovery through NVML works) and reports a version."""

from __future__ import annotations

from gpupool.agent.devices.discovery import Discovered, DiscoveryBackend, DiscoveryError, driver_version
from gpupool.agent.state.validation import Result


def judge(discovered: Discovered) -> Result:
    if not discovered.devices:
        return Result.failed("the driver reports no GPU")
    if driver_version(discovered.driver_version) is None:
        return Result.failed(f"the driver reports no usable version ({discovered.driver_version!r})")
    return Result.passed()


def check(backend: DiscoveryBackend) -> Result:
    try:
        return judge(backend.discover())
    except DiscoveryError as e:
        return Result.failed(str(e))
