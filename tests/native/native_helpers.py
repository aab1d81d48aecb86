"""Build the fake driver, the fake NVML, the probe and the interception library into a temporary folder,
and drive probes (tests/native/fakes/probe.c) as child processes.

The library under test is built with GP_LIMITS_PATH=/proc/self/fd/201: a path fixed at build time, like the
production one (/run/gpupool/limits/limits.v1), which the harness points at each pod's own limits file by
handing the probe that file, opened read-only, as descriptor 201 (a mount namespace per pod would need
privileges the tests do not have). Nothing in the probe's environment can move it.

GPUPOOL_TEST_NATIVE_SRC=<dir> builds the library from another copy of native/ (its own build.py): how the
tamper tests were shown to fail on the library before they were written (`git show HEAD~:native/...`)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import struct
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
FAKES = Path(__file__).resolve().parent / "fakes"
GIB = 1 << 30
MIB = 1 << 20
CC_FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror"]


LIMITS_FD = 201
LIMITS_DEFINE = f'-DGP_LIMITS_PATH="/proc/self/fd/{LIMITS_FD}"'


def native_build() -> ModuleType:
    src = Path(os.environ.get("GPUPOOL_TEST_NATIVE_SRC") or ROOT / "native")
    spec = importlib.util.spec_from_file_location("gpupool_native_build", src / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def have_cc() -> bool:
    return shutil.which(os.environ.get("CC", "cc")) is not None


def _cc(*args: str) -> None:
    subprocess.run([os.environ.get("CC", "cc"), *args], check=True, capture_output=True, text=True)


@dataclass(frozen=True)
class Built:
    dir: Path
    hook: Path
    probe: Path


def build_all(out: Path, extra: list[str] | None = None) -> Built:
    """Fakes are linked -Bsymbolic: their internal calls must not come back through the library under test
    (a real libcuda does not call its own exports through the PLT)."""
    extra = extra or []
    out.mkdir(parents=True, exist_ok=True)
    shared = [*CC_FLAGS, *extra, "-fPIC", "-shared", "-Wl,-Bsymbolic"]
    _cc(*shared, "-o", str(out / "libcuda.so.1"), str(FAKES / "fake_cuda.c"), "-lpthread")
    _cc(*shared, "-o", str(out / "libnvidia-ml.so.1"), str(FAKES / "fake_nvml.c"), "-lpthread")
    _cc(*CC_FLAGS, *extra, "-o", str(out / "probe"), str(FAKES / "probe.c"), f"-L{out}", "-l:libcuda.so.1",
        "-ldl", "-lpthread")
    hook = native_build().compile_library(out / "libgpupool_hook.so", [*extra, LIMITS_DEFINE])
    return Built(out, hook, out / "probe")


@dataclass
class Pod:
    """One pod: its hook directory and limits; `env` is what the agent would give its containers.

    granted=True: the agent's grant as it is meant to be, limits.v1 written by the agent's own writer
    (gpupool.agent.state.hookdir.write_limits) into hook_dir/limits and handed to every process read-only, the
    accounting in hook_dir/hook; the environment carries the same values as today's grant does (and
    GPUPOOL_HOOK_DIR), which is what a tenant tampers with: `extra` overrides variables, `unset` removes them.
    pid_ns: the simulated PID namespace of the pod's processes (FAKE_GPU_PID_NS, fake_state.h)."""

    built: Built
    state: Path
    hook_dir: Path
    memory_mib: str | None = None
    cores: str | None = None
    mode: str | None = None
    extra: dict[str, str] = field(default_factory=dict)
    preload: bool = True
    granted: bool = False
    pid_ns: int = 0
    samples: str | None = None  # FAKE_GPU_NVML_SAMPLES: None/"all" or "latest"
    gpu: dict[str, str] = field(default_factory=dict)  # the simulated GPU's parameters (FAKE_GPU_*, fake_state.h)
    unset: tuple[str, ...] = ()
    asan_runtime: str | None = None  # LD_PRELOAD it first (the probe and library are built with ASan)
    oversub_mib: int = 0  # granted pods: memory oversubscription per GPU in the limits file
    namespaces: bool = False  # run in PID and mount namespaces of its own, with a fresh /proc, as in a pod
    gpus: tuple[str, ...] = ()  # granted pods: the GPUs' UUIDs in the limits file (empty: matched by ordinal)

    @property
    def accounting(self) -> Path:
        return self.hook_dir / "hook" if self.granted else self.hook_dir

    def write_limits(self) -> Path:
        from gpupool.agent.state.hookdir import HookLimits, limits_dir, write_limits

        mem = [int(x) for x in (self.memory_mib or "0").split(",")]
        cores = [float(x) for x in (self.cores or "100").split(",")]
        n = max(len(mem), len(cores))
        mem += [0] * (n - len(mem))
        cores += [100.0] * (n - len(cores))
        self.accounting.mkdir(parents=True, exist_ok=True)
        return write_limits(limits_dir(self.hook_dir), HookLimits(
            memory_mib=tuple(mem), cores=tuple(cores), mode=self.mode or "hard",
            accounting_dir=str(self.accounting), oversub_mib=(self.oversub_mib,) * n if self.oversub_mib else (),
            gpus=self.gpus))

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "FAKE_GPU_"))}
        env.pop("LD_PRELOAD", None)
        env.update(LD_LIBRARY_PATH=str(self.built.dir), FAKE_GPU_STATE=str(self.state),
                   GPUPOOL_HOOK_DIR=str(self.accounting))
        if self.pid_ns:
            env["FAKE_GPU_PID_NS"] = str(self.pid_ns)
        if self.samples:
            env["FAKE_GPU_NVML_SAMPLES"] = self.samples
        env.update(self.gpu)
        if self.preload:
            env["LD_PRELOAD"] = str(self.built.hook)
            if self.asan_runtime:
                env["LD_PRELOAD"] = f"{self.asan_runtime}:{self.built.hook}"
        for key, value in (("GPUPOOL_MEMORY_LIMIT_MIB", self.memory_mib), ("GPUPOOL_CORES_PERCENT", self.cores),
                           ("GPUPOOL_CORES_MODE", self.mode)):
            if value is not None:
                env[key] = value
        env.update(self.extra)
        for key in self.unset:
            env.pop(key, None)
        return env

    def handed(self) -> list[tuple[Path, int]]:
        """The agent's files the pod's processes are handed read-only, each at the descriptor the library (built
        for tests) reads it from: limits.v1 of a granted pod, written first."""
        if not self.granted:
            return []
        limits = self.hook_dir / "limits" / "limits.v1"
        if not limits.exists():
            self.write_limits()
        return [(limits, LIMITS_FD)]

    def start(self, mode: str = "direct") -> Probe:
        argv = [str(self.built.probe), mode]
        if self.namespaces:
            argv = ["unshare", "--mount", "--pid", "--fork", "--mount-proc", *argv]
        handed = self.handed()
        for path, target in handed:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            os.dup2(fd, target, inheritable=False)  # pass_fds makes it inheritable in the child only
            os.close(fd)
        try:
            return Probe(subprocess.Popen(argv, env=self.env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, bufsize=1,
                                          pass_fds=tuple(t for _, t in handed)))
        finally:
            for _, target in handed:
                os.close(target)


class Probe:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ask(self, command: str) -> list[int]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"probe died on {command!r}: {self.stderr()}"
        return [int(x) for x in line.split()]

    def alloc(self, kind: str, nbytes: int) -> tuple[int, int]:
        rc, handle = self.ask(f"alloc {kind} {nbytes}")
        return rc, handle

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None or self.proc.stderr.closed:
            return ""
        return self.proc.stderr.read()

    def close(self) -> str:
        """End the probe (EOF on its stdin) and return what it wrote on stderr."""
        return end_process(self.proc, 10)


def end_process(proc: subprocess.Popen[str], timeout: float) -> str:
    """End a command-driven test program: EOF on its stdin, `timeout` seconds to exit (then SIGKILL); returns
    what it wrote on stderr."""
    if proc.stdin is not None and not proc.stdin.closed:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return drain(proc)


def drain(proc: subprocess.Popen[str]) -> str:
    """What an ended process wrote on stderr; its pipes closed."""
    err = ""
    if proc.stderr is not None and not proc.stderr.closed:
        err = proc.stderr.read()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    return err


# ---- the fake device's kernel log (layout of struct fake_state in fakes/fake_state.h) -----------------------
_PROCS, _IVS = 256, 1 << 16
_IV_OFFSET = 32 + _PROCS * 40


def kernel_log(state: Path) -> list[tuple[int, int, int]]:
    data = state.read_bytes()
    (count,) = struct.unpack_from("<Q", data, 24)
    first = max(0, count - _IVS)
    out = []
    for k in range(first, count):
        out.append(struct.unpack_from("<qqq", data, _IV_OFFSET + (k % _IVS) * 24))
    return out


def busy_share(state: Path, pids: set[int], t0: int, t1: int) -> float:
    """Share of [t0, t1] (CLOCK_MONOTONIC ns) during which kernels of `pids` occupied the fake device."""
    busy = 0
    for pid, start, end in kernel_log(state):
        if pid in pids:
            busy += max(0, min(end, t1) - max(start, t0))
    return busy / (t1 - t0)


def active_window(state: Path, pids: list[int], skip_ns: int, trim_ns: int) -> tuple[int, int]:
    """From `skip_ns` after the last of `pids` launched its first kernel to `trim_ns` before the first of
    them launched its last: the time they all ran, whatever the machine's load did to their start-up."""
    log = kernel_log(state)
    firsts = [min(s for p, s, _ in log if p == pid) for pid in pids]
    lasts = [max(e for p, _, e in log if p == pid) for pid in pids]
    return max(firsts) + skip_ns, min(lasts) - trim_ns


def now_ns() -> int:
    return time.monotonic_ns()
