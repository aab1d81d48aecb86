"""gpupool's CUDA interception library (built from native/ at install time) and helpers around it."""

from __future__ import annotations

from pathlib import Path

LIBRARY_NAME = "libgpupool_hook.so"


def library_path() -> Path:
    """Where the installed library lies (it may not exist: a source tree that was never installed)."""
    return Path(__file__).resolve().parent / LIBRARY_NAME
