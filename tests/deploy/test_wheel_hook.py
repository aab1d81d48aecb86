"""The wheel: it carries the compiled interception library where `gpupool hook path` looks for it, and what
`gpupool demo` runs, but none of the test harness."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("wheel")
    # From a copy without setuptools' build/ directory: files it kept from an earlier layout would end up in
    # the wheel, which a clean checkout's would not carry.
    source = out / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info",
                                                                 "__pycache__", "node_modules"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
         str(source)],
        capture_output=True, text=True, cwd=out,
    )
    assert done.returncode == 0, done.stderr  # a missing C compiler fails here: CI installs one
    (wheel,) = out.glob("gpupool-*.whl")
    with zipfile.ZipFile(wheel) as z:
        return {name: z.read(name) for name in z.namelist()}


def test_the_wheel_carries_the_built_library(wheel_files: dict[str, bytes]) -> None:
    assert wheel_files["gpupool/hook/libgpupool_hook.so"][:4] == b"\x7fELF"


def test_the_wheel_carries_the_demo_but_no_test_harness(wheel_files: dict[str, bytes]) -> None:
    names = set(wheel_files)
    assert {"gpupool/demo/embedded.py", "gpupool/demo/kube_scheduler.py",
            "gpupool/demo/scenarios/default.yaml"} <= names
    # The real-Kubernetes harness (testbed, fleets, stand-in kubelet) and the tests stay in the checkout.
    assert not [n for n in names if n.startswith(("gpupool/testing/", "tests/"))]
    assert not [n for n in names if n.rsplit("/", 1)[-1] in ("testbed.py", "fleet.py", "kubelet.py")]
