"""The library, the fakes and the probe built with AddressSanitizer + UndefinedBehaviorSanitizer, driven
through every lookup path (direct, dlsym, cuGetProcAddress, cuGetProcAddress_v2), every allocation entry
point the library intercepts, every launch entry point, many threads, kill -9 mid-allocation and a squeeze
written at runtime. The probe links the ASan runtime; LD_PRELOAD must then list that runtime before the
library (ASan insists on coming first in the initial library list).

A sanitizer run that is not really sanitizing passes everything, so the first tests prove it is: the
library's code carries the ASan/UBSan checks, and a fault planted inside the library (the probe's
`plant` command) kills the process with a report whose top frame is the library's source."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.agent.state.hookdir import read_usage, write_squeeze
from tests.native.native_helpers import GIB, Built, Pod, Probe, active_window, build_all, busy_share, have_cc, now_ns

SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g", "-O1"]
OOM = 2
SHARE = 10 * GIB
S = 1_000_000_000
PATHS = ["direct", "dlsym", "gpa", "gpa2"]
# Every allocating entry point the library wraps (native/gp_mem.c), by the probe's kind names. The v1 ones
# have no cuGetProcAddress form of their own (a CUDA >= 3.2 caller gets the _v2 ABI for the base name).
KINDS = ["mem", "pitch", "managed", "async", "async_ptsz", "pool", "pool_ptsz", "vmm", "array", "array3d",
         "mipmap"]
V1_KINDS = ["mem1", "pitch1", "array1", "array3d1"]
LAUNCHES = ["kernel", "kernel_ptsz", "ex", "ex_ptsz", "coop", "coop_ptsz", "graph", "graph_ptsz"]
CLEAN_ENV = {"ASAN_OPTIONS": "halt_on_error=1:detect_leaks=1",
             "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}


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


class Sanitized:
    """Probes of the sanitized build; every one must end with exit code 0 and a clean stderr."""

    def __init__(self, built: Built, runtime: str, root: Path) -> None:
        self.built, self.runtime, self.root = built, runtime, root
        self.device = root / "gpu"
        self.count = 0
        self.started: list[Probe] = []
        self.killed: set[int] = set()

    def pod(self, **kwargs: object) -> Pod:
        self.count += 1
        hook_dir = self.root / f"pod-{self.count}"
        hook_dir.mkdir()
        extra = {**CLEAN_ENV, **dict(kwargs.pop("extra", {}) or {})}  # type: ignore[call-overload]
        return Pod(self.built, self.device, hook_dir, asan_runtime=self.runtime, extra=extra,
                   **kwargs)  # type: ignore[arg-type]

    def start(self, pod: Pod, path: str = "direct") -> Probe:
        probe = pod.start(path)
        self.started.append(probe)
        return probe

    def kill(self, probe: Probe) -> None:
        self.killed.add(probe.pid)
        probe.proc.send_signal(signal.SIGKILL)
        probe.proc.wait()

    def finish(self, probe: Probe) -> None:
        err = probe.close()
        if probe.pid in self.killed:
            return
        assert probe.proc.returncode == 0, err
        assert "runtime error" not in err and "Sanitizer" not in err, err


@pytest.fixture
def sanitized(asan_built: tuple[Built, str], tmp_path: Path) -> Iterator[Sanitized]:
    built, rt = asan_built
    factory = Sanitized(built, rt, tmp_path)
    yield factory
    for probe in factory.started:
        factory.finish(probe)


# ---- the run is really sanitized ----------------------------------------------------------------------------
def _undefined(library: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--undefined-only", str(library)], capture_output=True, text=True)
    assert out.returncode == 0, f"nm (binutils) is needed to read the library's symbols: {out.stderr}"
    return {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}


def test_the_sanitized_library_carries_asan_and_ubsan_checks_and_the_plain_one_none(
        asan_built: tuple[Built, str], built: Built) -> None:
    names = _undefined(asan_built[0].hook)
    assert "__asan_init" in names or any(n.startswith("__asan_version_mismatch_check") for n in names), names
    assert any(n.startswith("__asan_report_load") for n in names)  # loads are checked
    assert any(n.startswith("__asan_report_store") for n in names)  # stores are checked
    assert any(n.startswith("__ubsan_handle_") for n in names)
    assert not any(n.startswith(("__asan_", "__ubsan_")) for n in _undefined(built.hook))


@pytest.mark.parametrize(("fault", "report"), [
    ("overflow", "ERROR: AddressSanitizer: heap-buffer-overflow"),
    ("misaligned", "runtime error: member access within misaligned address"),
])
def test_a_fault_planted_inside_the_library_is_caught_there(
        asan_built: tuple[Built, str], tmp_path: Path, built: Built, fault: str, report: str) -> None:
    asan, rt = asan_built
    (tmp_path / "hook").mkdir()
    pod = Pod(asan, tmp_path / "gpu", tmp_path / "hook", memory_mib="1024", asan_runtime=rt, extra=CLEAN_ENV)
    done = subprocess.run([str(asan.probe), "direct"], input=f"plant {fault}\n", env=pod.env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and done.stdout == "", (done.stdout, done.stderr)
    assert report in done.stderr, done.stderr
    frame = re.search(r"^\s*#0 .*$", done.stderr[done.stderr.index(report):], re.MULTILINE)
    assert frame is not None and "cuArrayCreate_v2" in frame.group(0), done.stderr
    assert "native/gp_mem.c" in frame.group(0) or "libgpupool_hook.so" in frame.group(0), frame.group(0)
    # the same fault goes unseen by the plain build: what the sanitizers add
    plain = Pod(built, tmp_path / "gpu2", tmp_path / "hook", memory_mib="1024")
    done = subprocess.run([str(built.probe), "direct"], input=f"plant {fault}\n", env=plain.env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_the_asan_runtime_and_the_library_are_both_loaded_in_the_probe(sanitized: Sanitized) -> None:
    probe = sanitized.start(sanitized.pod(memory_mib="1024"))
    assert probe.alloc("mem", 1)[0] == 0
    maps = Path(f"/proc/{probe.pid}/maps").read_text()
    assert os.path.realpath(sanitized.runtime) in {os.path.realpath(p) for p in re.findall(r"\s(/\S+)$", maps,
                                                                                            re.MULTILINE)}
    assert str(sanitized.built.hook) in maps


# ---- every path, every entry point ---------------------------------------------------------------------------
@pytest.mark.parametrize("path", PATHS)
def test_every_allocation_kind_is_capped_and_clean_on_every_lookup_path(sanitized: Sanitized, path: str) -> None:
    probe = sanitized.start(sanitized.pod(memory_mib="10240"), path)
    kinds = KINDS + (V1_KINDS if path in ("direct", "dlsym") else [])
    for kind in kinds:
        rc, handle = probe.alloc(kind, GIB)
        assert rc == 0, kind
        assert probe.ask("info") == [0, SHARE - GIB, SHARE], kind  # counted
        assert probe.ask(f"free {kind} {handle}") == [0], kind
        assert probe.ask("info") == [0, SHARE, SHARE], kind  # and given back
    for kind in kinds:  # fill the share with each kind in turn, then not one byte more of any kind
        handles = []
        for _ in range(10):
            rc, handle = probe.alloc(kind, GIB)
            assert rc == 0, kind
            handles.append(handle)
        for other in kinds:
            assert probe.alloc(other, 16)[0] == OOM, (kind, other)
        for handle in handles:
            assert probe.ask(f"free {kind} {handle}") == [0], kind
    assert probe.ask("total") == [0, SHARE]
    assert probe.ask("nvml") == [0, SHARE, SHARE, 0]
    assert probe.ask("echo") == [1001, 2001, 0, 1002]  # unknown symbols pass through


@pytest.mark.parametrize("path", PATHS)
def test_every_launch_kind_is_paced_and_clean_on_every_lookup_path(sanitized: Sanitized, path: str) -> None:
    probe = sanitized.start(sanitized.pod(memory_mib="10240", cores="30"), path)
    for kind in LAUNCHES:
        rc, launches = probe.ask(f"launch {kind} 2000 0.25 4")
        assert rc == 0 and launches > 0, kind
    # paced: 2 s of 2 ms kernels at a 30 % cap, read from the device's own log
    rc, _ = probe.ask("launch kernel 2000 1.5 4")
    assert rc == 0
    window = active_window(sanitized.device, [probe.pid], 0, S // 10)
    start = window[1] - 11 * S // 10
    assert busy_share(sanitized.device, {probe.pid}, start, window[1]) == pytest.approx(0.30, abs=0.05)


def test_sixteen_threads_never_pass_the_cap_and_are_clean(sanitized: Sanitized) -> None:
    probe = sanitized.start(sanitized.pod(memory_mib="1024"))
    rc, max_live, successes, failures, others = probe.ask("threads 16 400 3 1048576 4194304 67108864")
    assert rc == 0 and others == 0
    assert 0 < max_live <= GIB and successes > 0 and failures > 0
    assert probe.ask("info") == [0, GIB, GIB]  # every thread freed what it held


# ---- kill -9 and the squeeze -----------------------------------------------------------------------------
def test_kill_9_mid_allocation_leaves_a_clean_heir_the_whole_share(sanitized: Sanitized) -> None:
    pod = sanitized.pod(memory_mib="10240")
    rng = random.Random(11)
    for _ in range(4):
        victim = sanitized.start(pod)
        victim.send(f"stress {GIB}")
        assert victim.proc.stdout is not None and victim.proc.stdout.readline() == "started\n"
        time.sleep(rng.uniform(0.0, 0.05))  # where in its loop it dies: the randomness under test, not a wait
        sanitized.kill(victim)
        heir = sanitized.start(pod)
        assert heir.alloc("mem", SHARE)[0] == 0
        assert heir.alloc("mem", 1)[0] == OOM
        sanitized.finish(heir)
        sanitized.started.remove(heir)


def test_a_squeeze_written_while_launching_is_honoured_and_clean(sanitized: Sanitized) -> None:
    pod = sanitized.pod(cores="100")
    probe = sanitized.start(pod)
    assert probe.alloc("mem", 1)[0] == 0
    deadline = time.monotonic() + 30
    while not read_usage(pod.hook_dir):
        assert time.monotonic() < deadline, "the library never made its shared file"
        time.sleep(0.01)
    written = write_squeeze(pod.hook_dir, {0: 30})
    assert written is not None and written.changed and written.enforced
    rc, _ = probe.ask("launch kernel 2000 1.5 4")
    assert rc == 0
    squeezed_end = now_ns()
    assert write_squeeze(pod.hook_dir, {}) is not None
    rc, _ = probe.ask("launch kernel 2000 1.0 4")
    assert rc == 0
    start, end = active_window(sanitized.device, [probe.pid], 4 * S // 10, S // 10)
    assert busy_share(sanitized.device, {probe.pid}, start, squeezed_end) == pytest.approx(0.30, abs=0.05)
    assert busy_share(sanitized.device, {probe.pid}, squeezed_end + 4 * S // 10, end) > 0.8
