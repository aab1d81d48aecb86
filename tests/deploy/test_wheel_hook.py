"""The wheel carries the compiled interception library where `gpupool hook path` looks for it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_carries_the_built_library(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path),
         str(ROOT)],
        capture_output=True, text=True, cwd=tmp_path,
    )
    if done.returncode != 0 and "no C compiler" in done.stderr:
        pytest.skip("no C compiler")
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("gpupool-*.whl")
    with zipfile.ZipFile(wheel) as z:
        data = z.read("gpupool/hook/libgpupool_hook.so")
    assert data[:4] == b"\x7fELF"
