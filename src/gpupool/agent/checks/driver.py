"""Validation step `driver`: the driver answers (discovery through NVML works) and reports a version."""

from __future__ import annotations

import re

from gpupool.agent.devices import Discovered, DiscoveryBackend, DiscoveryError
from gpupool.agent.validation import Result

_VERSION = re.compile(r"^(\d+)\.(\d+)")


def driver_version(text: str) -> tuple[int, int] | None:
    """(major, minor) of a driver version such as 570.86.15; None when it is not one."""
    m = _VERSION.match(text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


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
