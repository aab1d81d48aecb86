"""gpupool's interception libraries (built from native/ at install time) and helpers around them: the CUDA
library, and the memory cap for HIP programs (native/hip/, docs/hook-hip.md)."""

from __future__ import annotations

from pathlib import Path

LIBRARY_NAME = "libgpupool_hook.so"
HIP_LIBRARY_NAME = "libgpupool_hip.so"


def library_path() -> Path:
    """Where the installed library lies (it may not exist: a source tree that was never installed)."""
    return Path(__file__).resolve().parent / LIBRARY_NAME


def hip_library_path() -> Path:
    """Where the installed HIP memory cap lies (it may not exist: a source tree that was never installed)."""
    return Path(__file__).resolve().parent / HIP_LIBRARY_NAME
