"""Validation step `isolation`: what enforces shares on this node works.

- isolation `hook`: the interception library the agent installed for containers loads in a separate test
  process (a broken copy would make every hook container fail at start, or run unlimited), and its caps
  apply on every GPU: a probe process (`python -m gpupool.agent.checks.isolation`) runs with the library
  preloaded under a memory cap and a compute cap and checks, on each GPU the driver shows it,
  - memory: CUDA reports the cap as the GPU's total; what is free under it can be allocated, and one byte
    more than what is then left is refused with CUDA_ERROR_OUT_OF_MEMORY (the GPU itself has that memory);
  - compute: a loop of spin kernels (gpupool.agent.checks.cudaprobe) launched as fast as the library lets
    it keeps the GPU busy at most `PROBE_TOLERANCE` points above `PROBE_CORES` % of the time, and at least
    half of it, measured with the probe's own CUDA events against wall time (never with anything the
    library reports);
- MPS daemons (where the agent runs them): every GPU's daemon answered its last probe;
- MIG (where a GPU is in MIG mode): NVML's instances were reconciled with the agent's MIG checkpoint.

The probe gives its caps in the environment (GPUPOOL_MEMORY_LIMIT_MIB, GPUPOOL_CORES_PERCENT): the limits
file path compiled into the library is the container's read-only mount point, which the agent's own
container does not have, and without a file there the library takes its caps from the environment (with a
file there, the environment can only lower them, so the probe's caps still hold). Both roads end in the
same enforcement, which is what the probe proves. The memory cap is 2 GiB, not smaller: the library counts
the CUDA context (about 0.5 GiB on an H100) against the cap.

Its share is (launches done x the median launch's span) / wall time: every launch is the same kernel, so
the median is its length, whatever a few spans got wrong. What it cannot tell apart from a cap that does
not hold: a GPU so busy with other processes that most of the probe's kernels queue behind theirs. The
agent therefore probes a library build once (`Proven`), normally at start, before it advertises anything.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpupool.agent.checks.cudaprobe import (
    CUDA_ERROR_OUT_OF_MEMORY,
    Context,
    CudaError,
    Driver,
    Spin,
    Stream,
    Timeline,
)
from gpupool.agent.state.hookdir import learnt_scales
from gpupool.agent.state.validation import Result

if TYPE_CHECKING:  # the probe child imports this module: it needs nothing beyond the standard library
    from gpupool.agent.devices.mps import DaemonHealth

_LOAD = "import ctypes, sys; ctypes.CDLL(sys.argv[1])"
PROBE_MEMORY_MIB = 2048
PROBE_CORES = 30.0
PROBE_TOLERANCE = 10.0  # points above the cap, over PROBE_SECONDS: beyond that the cap does not hold
# Below the cap only a pacing that starves its tenant fails (half its share): a probe whose process is short
# of CPU, or whose kernels queue behind a neighbour's, reads low without the cap being at fault.
PROBE_FLOOR = PROBE_CORES / 2
PROBE_SECONDS = 1.5
PROBE_KERNEL_US = 1000.0
MAX_GPUS = 16  # the library's GP_MAX_DEV: one cap per GPU in the environment
FAKE_ENV = "GPUPOOL_CUDAPROBE_FAKE"  # "1": the simulated GPU of the tests (its module format)
MIB = 1 << 20


@dataclass(slots=True)
class Proven:
    """The library build whose caps the probe last proved, by (path, size, mtime): the agent probes once,
    not at every periodic pass. The caps are a property of the library and the driver, both fixed for the
    agent's life (a new library is a new file; a new driver means a reboot), while a probe on a GPU busy
    with tenants costs them 2 GiB and 30 % of it for 1.5 s and can read low. A failure is never kept: the
    next pass probes again."""

    key: tuple[str, int, int] | None = None
    # NVML's smUtil scale the library learnt on each GPU while the probe ran alone there (ppm, by CUDA
    # ordinal in PCI bus order, i.e. NVML's index; 0: not learnt): the agent hands it to the pods' libraries
    scales: tuple[int, ...] = ()


def _identity(path: Path) -> tuple[str, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (str(path), st.st_size, st.st_mtime_ns)


@dataclass(frozen=True, slots=True)
class Facts:
    hook_problem: str | None  # None: the library loaded and its caps apply, or the node does not use hook
    mps: Mapping[str, DaemonHealth]  # empty: the agent runs no MPS daemons
    mig_reconciled: bool | None  # None: no MIG manager on this node


def judge(facts: Facts) -> Result:
    problems: list[str] = []
    if facts.hook_problem is not None:
        problems.append(f"interception library: {facts.hook_problem}")
    down = sorted(g for g, h in facts.mps.items() if not h.up)
    if down:
        first = facts.mps[down[0]]
        problems.append(f"MPS daemon down on {', '.join(down)} ({first.last_error or 'not started'})")
    if facts.mig_reconciled is False:
        problems.append("MIG instances not yet reconciled with the agent's MIG checkpoint")
    return Result.failed("; ".join(problems)) if problems else Result.passed()


def library_loads(path: Path, timeout_s: float = 20.0) -> str | None:
    """Load the library in a child process (never in the agent: it would interpose on the agent's own
    calls); None when it loads, else why not."""
    if not path.is_file():
        return f"{path} is missing"
    try:
        done = subprocess.run([sys.executable, "-c", _LOAD, str(path)], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"loading {path} failed: {e}"
    if done.returncode != 0:
        return f"{path} does not load: {(done.stderr.strip().splitlines() or ['no output'])[-1]}"
    return None


def probe_env(library: Path, accounting: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The probe's environment: the library preloaded, the probe's caps on every GPU (by ordinal), its own
    accounting directory; nothing of the agent's GPUPOOL_* settings or preloads."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.pop("NVIDIA_VISIBLE_DEVICES", None)  # caps by ordinal: the probe sees every GPU of the node
    env.update(extra or {})
    env.update(LD_PRELOAD=str(library),
               GPUPOOL_MEMORY_LIMIT_MIB=",".join([str(PROBE_MEMORY_MIB)] * MAX_GPUS),
               GPUPOOL_CORES_PERCENT=",".join([f"{PROBE_CORES:g}"] * MAX_GPUS),
               GPUPOOL_CORES_MODE="hard", GPUPOOL_HOOK_DIR=str(accounting),
               # CUDA orders devices fastest first by default; in PCI bus order ordinal i is NVML's index i,
               # so the scale learnt on ordinal i belongs to the GPU discovery lists at index i
               CUDA_DEVICE_ORDER="PCI_BUS_ID")
    return env


@dataclass(frozen=True, slots=True)
class Probed:
    problem: str | None  # None: the caps applied on every GPU
    scales: tuple[int, ...] = ()  # what the library learnt of NVML's scale on each GPU (Proven.scales)


def caps_apply(library: Path, env: Mapping[str, str] | None = None, timeout_s: float = 30.0) -> Probed:
    """Run the probe (module docstring) with `library` preloaded: whether the caps applied on every GPU, and
    the NVML scale the library learnt meanwhile. `env`: added to the probe's environment (the tests'
    simulated GPU)."""
    with tempfile.TemporaryDirectory(prefix="gpupool-isolation-probe-") as tmp:
        try:
            done = subprocess.run([sys.executable, "-m", __name__], capture_output=True, text=True,
                                  timeout=timeout_s + 4 * PROBE_SECONDS * MAX_GPUS, check=False,
                                  env=probe_env(library, Path(tmp), env))
        except subprocess.TimeoutExpired:
            return Probed("the caps probe did not finish in time")
        except OSError as e:
            return Probed(f"cannot start the caps probe: {e}")
        scales = learnt_scales(Path(tmp))
    lines = [line for line in done.stdout.strip().splitlines() if line.strip()]
    if done.returncode == 0:
        return Probed(None, scales)
    if lines:
        return Probed(lines[-1])
    err = done.stderr.strip().splitlines()
    return Probed(f"the caps probe exited with {done.returncode}" + (f": {err[-1]}" if err else ""))


def check(library: Path | None, mps: Mapping[str, DaemonHealth], mig_reconciled: Callable[[], bool] | None,
          env: Mapping[str, str] | None = None, proven: Proven | None = None) -> Result:
    """`library`: the installed interception library (None: the node does not use isolation hook).
    `proven`: where the agent remembers a build whose caps were proven (None: probe every time)."""
    hook = None if library is None else library_loads(library)
    if hook is None and library is not None:
        key = _identity(library)
        if proven is None or key is None or proven.key != key:
            probed = caps_apply(library, env)
            hook = probed.problem
            if proven is not None:
                proven.key = key if hook is None else None
                if hook is None:
                    proven.scales = probed.scales
    return judge(Facts(hook, dict(mps), None if mig_reconciled is None else mig_reconciled()))


# ---- the probe itself (in the child, with the library preloaded) ---------------------------------------
def _memory_problem(driver: Driver, gpu: int) -> str | None:
    cap = PROBE_MEMORY_MIB * MIB
    free, total = driver.mem_info()
    if total != cap:
        return (f"GPU {gpu}: the memory cap does not apply: CUDA reports {total // MIB} MiB in total under a "
                f"{PROBE_MEMORY_MIB} MiB cap")
    held = []
    try:
        # all that is free under the cap but a little (a driver may round an allocation up to 2 MiB)
        within = (free - 4 * MIB) // (2 * MIB) * (2 * MIB)
        if within > 0:
            try:
                held.append(driver.alloc(within))
            except CudaError as e:
                return f"GPU {gpu}: {within // MIB} MiB within the {PROBE_MEMORY_MIB} MiB cap was refused ({e})"
        left, _ = driver.mem_info()
        try:
            held.append(driver.alloc(left + 1))
        except CudaError as e:
            if e.code != CUDA_ERROR_OUT_OF_MEMORY:
                return f"GPU {gpu}: one byte beyond the memory cap failed with CUDA error {e.code}, not out of memory"
            return None
        return f"GPU {gpu}: the memory cap does not apply: one byte beyond the {PROBE_MEMORY_MIB} MiB cap was allocated"
    finally:
        for ptr in held:
            driver.free(ptr)


def _compute_problem(driver: Driver, gpu: int, fake: bool) -> str | None:
    spin = Spin(driver, gpu, fake=fake)
    stream = Stream(driver)
    timeline = Timeline(driver, stream, depth=32)  # 32 ms queued: a probe short of CPU still keeps it busy
    try:
        begin = time.monotonic_ns()
        deadline = begin + int(PROBE_SECONDS * 1e9)
        while time.monotonic_ns() < deadline:
            spin.launch(stream, PROBE_KERNEL_US)
            timeline.started()
            timeline.ended()
        spans = timeline.drain()
        end = max(time.monotonic_ns(), spans[-1].end if spans else 0)
    finally:
        timeline.close()
        stream.destroy()
        spin.close()
    if not spans:
        return f"GPU {gpu}: the compute probe ran no kernel"
    # Every launch is the same kernel, so each counts the median span: robust to the few spans a busy
    # machine gets wrong either way (a neighbour's kernel queued ahead lengthens one; a probe descheduled
    # between a launch's return and its clock reading shortens one, to nothing if the kernel ended meanwhile).
    unit = statistics.median(s.end - s.start for s in spans)
    share = 100.0 * len(spans) * unit / (end - begin)
    if share > PROBE_CORES + PROBE_TOLERANCE:
        return (f"GPU {gpu}: the compute cap does not apply: a {PROBE_CORES:g} % cap kept the GPU busy "
                f"{share:.1f} % of {PROBE_SECONDS:g} s (at most {PROBE_CORES + PROBE_TOLERANCE:g} allowed)")
    if share < PROBE_FLOOR:
        return (f"GPU {gpu}: the compute cap starves its tenant: a {PROBE_CORES:g} % cap kept the GPU busy only "
                f"{share:.1f} % of {PROBE_SECONDS:g} s (at least {PROBE_FLOOR:g} expected)")
    return None


def probe() -> str | None:
    """In the child: None when both caps applied on every GPU, else the first problem."""
    fake = os.environ.get(FAKE_ENV) == "1"
    try:
        driver = Driver()
        count = driver.init()
        if count == 0:
            return "CUDA shows no GPU to the caps probe"
        for gpu in range(min(count, MAX_GPUS)):
            with Context(driver, gpu):
                problem = _memory_problem(driver, gpu) or _compute_problem(driver, gpu, fake)
            if problem is not None:
                return problem
    except CudaError as e:
        return f"the caps probe failed: {e}"
    return None


if __name__ == "__main__":
    found = probe()
    if found is not None:
        print(found)
        sys.exit(1)
