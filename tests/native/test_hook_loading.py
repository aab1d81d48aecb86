"""Loading: under /etc/ld.so.preload every dynamically linked program of the container loads the library,
CUDA or not; it must stay inert there (nothing is done at load time, nothing printed, exit codes kept)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.native.native_helpers import Built


def _env(built: Built, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.pop("LD_LIBRARY_PATH", None)  # no libcuda anywhere: an ordinary program
    env.update(LD_PRELOAD=str(built.hook), GPUPOOL_MEMORY_LIMIT_MIB="1024", GPUPOOL_CORES_PERCENT="30", **extra)
    return env


def test_programs_that_never_touch_cuda_are_unaffected(built: Built) -> None:
    for argv in (["sh", "-c", "echo hello; exit 3"], [sys.executable, "-c", "import ctypes, json; print('py')"]):
        done = subprocess.run(argv, env=_env(built), capture_output=True, text=True, timeout=60)
        assert done.stderr == ""
        assert done.stdout in ("hello\n", "py\n")
        assert done.returncode == (3 if argv[0] == "sh" else 0)


def test_dlsym_keeps_working_for_everything_else(built: Built) -> None:
    # ctypes resolves every foreign function through dlsym, which the library interposes
    code = "import ctypes; libc = ctypes.CDLL(None); print(libc.abs(-7), libc.strlen(b'four'))"
    done = subprocess.run([sys.executable, "-c", code], env=_env(built), capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "7 4\n", "")


def test_the_library_exports_only_driver_and_nvml_entry_points_dlsym_and_dlvsym(built: Built) -> None:
    try:
        out = subprocess.run(["nm", "-D", "--defined-only", str(built.hook)], capture_output=True, text=True)
    except FileNotFoundError:
        pytest.fail("no nm: this test reads the library's exports with binutils' nm (install binutils)")
    # a library nm cannot read is a broken build, not a reason to look away
    assert out.returncode == 0, f"nm could not read {built.hook}: {out.stderr}"
    names = {line.split()[-1] for line in out.stdout.splitlines() if " T " in line}
    assert {"dlsym", "dlvsym", "cuMemAlloc_v2", "cuGetProcAddress_v2", "cuCtxCreate_v2"} <= names
    assert all(n in ("dlsym", "dlvsym") or n.startswith(("cu", "nvml")) for n in names), names
