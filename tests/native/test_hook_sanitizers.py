"""The library, the fakes and the probe built with AddressSanitizer + UndefinedBehaviorSanitizer, driven
through the memory, thread and compute paths. The probe links the ASan runtime; LD_PRELOAD must then list
that runtime before the library (ASan insists on coming first in the initial library list)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.native.native_helpers import GIB, Built, Pod, build_all, have_cc

SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g", "-O1"]


def runtime() -> str:
    """The ASan runtime of the compiler. Its absence fails the tests: a sanitizer run that cannot happen is a
    failure to report, not a skip to overlook."""
    assert have_cc(), "no C compiler: the native tests need one (set CC)"
    cc = os.environ.get("CC", "cc")
    out = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    assert out and os.path.isabs(out) and os.path.exists(out), f"{cc} has no ASan runtime (libasan.so)"
    return out


@pytest.fixture(scope="module")
def asan_built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Built, str]:
    return build_all(tmp_path_factory.mktemp("asan"), SANITIZE), runtime()


@pytest.mark.parametrize("path", ["direct", "gpa2"])
def test_memory_threads_and_pacing_are_clean_under_asan_and_ubsan(
    asan_built: tuple[Built, str], tmp_path: Path, path: str
) -> None:
    built, runtime = asan_built
    (tmp_path / "hook").mkdir()
    pod = Pod(built, tmp_path / "gpu", tmp_path / "hook", memory_mib="10240", cores="30",
              extra={"ASAN_OPTIONS": "halt_on_error=1:detect_leaks=1",
                     "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"})
    pod.preload = False
    env = pod.env()
    env["LD_PRELOAD"] = f"{runtime}:{built.hook}"
    script = "\n".join([
        f"alloc mem {5 * GIB}", f"alloc async {4 * GIB}", f"alloc array {GIB // 2}", f"alloc vmm {GIB // 2}",
        "alloc mem 1", "info", "nvml", "total", "echo",
        "launch kernel 2000 0.3 4", "launch graph 2000 0.2 4",
        "threads 16 200 3 1048576 4194304 67108864",
    ]) + "\n"
    done = subprocess.run([str(built.probe), path], input=script, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "runtime error" not in done.stderr and "AddressSanitizer" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    assert lines[4] == "2 0"  # the cap still holds in the instrumented build
    assert lines[5] == f"0 0 {10 * GIB}"
