"""The compute cap on the simulated device: kernels of 2 ms (2,000 blocks at 1 us each), launched in a loop
with a stream sync every 4 launches, as fast as the process can, i.e. every pod wants the whole GPU.
Shares are read from the fake device's own kernel log, not from the library. Tolerance: the issue's +-5
points; runs settle within ~0.3 s, so the first 0.4 s after every pod has started is not measured
(windows are anchored on the kernels themselves, so a slow process start on a loaded machine is not
counted as idle time)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.native.conftest import PodFactory
from tests.native.native_helpers import Pod, Probe, active_window, busy_share, kernel_log, now_ns

S = 1_000_000_000
KERNEL_BLOCKS = 2000


def run(probe: Probe, seconds: float, kind: str = "kernel") -> None:
    probe.send(f"launch {kind} {KERNEL_BLOCKS} {seconds} 4")


def finish(probe: Probe) -> int:
    assert probe.proc.stdout is not None
    rc, launches = (int(x) for x in probe.proc.stdout.readline().split())
    assert rc == 0
    return launches


# Every launch entry point the library wraps (native/gp_compute.c), each found on every lookup path an
# application uses (docs/concepts.md): the linked symbol, dlsym, cuGetProcAddress and cuGetProcAddress_v2.
LAUNCHES = ["kernel", "kernel_ptsz", "ex", "ex_ptsz", "coop", "coop_ptsz", "graph", "graph_ptsz"]
PATHS = ["direct", "dlsym", "gpa", "gpa2"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", LAUNCHES)
def test_one_pod_at_30_gets_30(pods: PodFactory, kind: str, path: str) -> None:
    probe = pods.start(pods.pod(cores="30"), path)
    run(probe, 1.5, kind)
    assert finish(probe) > 0
    share = busy_share(pods.device, {probe.pid}, *active_window(pods.device, [probe.pid], 4 * S // 10, S // 10))
    assert share == pytest.approx(0.30, abs=0.05)


def test_uncapped_the_same_loop_takes_the_whole_device(pods: PodFactory) -> None:
    probe = pods.start(pods.pod(cores="100"))
    run(probe, 1.0)
    finish(probe)
    assert busy_share(pods.device, {probe.pid}, *active_window(pods.device, [probe.pid], S // 4, S // 10)) > 0.8


def test_two_pods_at_30_and_70_the_smaller_gets_its_cap_the_larger_what_the_switches_leave(
        pods: PodFactory) -> None:
    """Caps adding up to 100 on a time-sliced GPU whose every context switch costs device time nobody gets
    (fake_state.h): the 30 is held to its cap, the 70 to at most its cap and to the rest, as in
    test_hook_compute_exact.py (measured 64-67 % for the 70 on a loaded 2-core machine)."""
    a = pods.start(pods.pod(cores="30"))
    b = pods.start(pods.pod(cores="70"))
    run(a, 2.5)
    run(b, 2.5)
    finish(a)
    finish(b)
    window = active_window(pods.device, [a.pid, b.pid], 4 * S // 10, S // 10)
    small, large = busy_share(pods.device, {a.pid}, *window), busy_share(pods.device, {b.pid}, *window)
    assert small == pytest.approx(0.30, abs=0.05)
    assert large <= 0.70 + 0.05 and small + large >= 0.90  # work-conserving, less the switches


def test_a_pods_cap_holds_across_its_processes(pods: PodFactory) -> None:
    """Two processes of one pod at 40 % together hold the cap. Before the pod's processes were told busy
    together across polls (native/gp_compute.c, pod_busy) this measured 40.7-42.2 % in about half the runs
    and 32.1-34.9 % in the other half: whether NVML's samples of the two came in one poll depended on their
    PIDs. Then 41.4-42.9 % over 12 runs: f and the provisional part took each process's NVML sample against
    the whole pod's events. Since each process is counted from its own newest sample: 40.3-41.3 % over 10."""
    pod = pods.pod(cores="40")
    a, b = pods.start(pod), pods.start(pod)
    run(a, 2.0)
    run(b, 2.0)
    finish(a)
    finish(b)
    window = active_window(pods.device, [a.pid, b.pid], 4 * S // 10, S // 10)
    assert busy_share(pods.device, {a.pid, b.pid}, *window) == pytest.approx(0.40, abs=0.03)


PERIOD_NS = 166_667_000  # the fake NVML's default sample period (fake_state.h, FAKE_GPU_PERIOD_US)


def nvml_phase(host_pid: int) -> int:
    """The phase of a host PID's NVML samples on the simulated GPU (fake_nvml.c, phase_of)."""
    return ((host_pid * 0x9E3779B97F4A7C15) % (1 << 64) >> 17) % PERIOD_NS


def start_at_phase(pods: PodFactory, pod: Pod, phase_ns: int, taken: set[int]) -> Probe:
    """A process of `pod` whose NVML samples come at `phase_ns` (within 2 ms) of the driver's period: its
    host PID (getpid() + FAKE_GPU_PID_NS) is chosen once its PID is known, through a shell that reads the
    offset and then becomes the probe (exec keeps the PID). `taken`: host PIDs already given (two processes
    at the same phase must not get the same one)."""
    shim = 'read ns; FAKE_GPU_PID_NS=$ns; export FAKE_GPU_PID_NS; exec "$0" direct'
    proc = subprocess.Popen(["sh", "-c", shim, str(pod.built.probe)], env=pod.env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    probe = Probe(proc)
    pods.probes.append(probe)

    def off(host: int) -> int:  # how far the host PID's phase is from the one wanted, either way round
        return abs((nvml_phase(host) - phase_ns + PERIOD_NS // 2) % PERIOD_NS - PERIOD_NS // 2)

    ns = pod.pid_ns
    while proc.pid + ns in taken or off(proc.pid + ns) > 2_000_000:
        ns += 1
    taken.add(proc.pid + ns)
    probe.send(str(ns))
    return probe


@pytest.mark.parametrize("apart_ms", [0, 40, 83])
def test_a_pod_of_two_holds_its_cap_whatever_its_processes_phases(pods: PodFactory, apart_ms: int) -> None:
    """The pod's processes are sampled by NVML at phases of their own. Samples 40 or 83 ms apart never
    come in one 20 ms poll: the library took the pod for one process busy alone, summed the two processes'
    events (each also counts the time its work waited for the other's slices) and held the pod to 31-35 %
    (before the fix, two runs each: 32.3/33.8 % at 83 ms apart, 32.2/35.4 % at 40, 41.6/42.4 % at 0; since,
    three runs each: 39.9-41.0, 40.6-40.9, 40.4-41.2)."""
    pod = pods.pod(cores="40")
    taken: set[int] = set()
    a = start_at_phase(pods, pod, 50_000_000, taken)
    b = start_at_phase(pods, pod, 50_000_000 + apart_ms * 1_000_000, taken)
    run(a, 2.0)
    run(b, 2.0)
    finish(a)
    finish(b)
    window = active_window(pods.device, [a.pid, b.pid], 4 * S // 10, S // 10)
    assert busy_share(pods.device, {a.pid, b.pid}, *window) == pytest.approx(0.40, abs=0.03)


def test_a_pod_of_two_learns_f_against_all_its_events(pods: PodFactory, tmp_path: Path) -> None:
    """f (native/gp.h, the trace's S lines) is the pod's device time against its events, so that the
    provisional part, f times each busy process's share of the events since its own newest sample, is
    the pod's device time there. With a per-process NVML sample weighed against the whole pod's events it
    came out at half of that (0.29-0.32 against 0.64-0.76 from the device's log, 3 runs), and the pod of
    two swung round its cap and ran over it by 1.4-2.9 points (test above). Graded from the device's own
    kernel log and the events the trace shows, from 0.6 s after the start (before that f is not learnt)."""
    trace = tmp_path / "trace"
    pod = pods.pod(cores="40", extra={"GPUPOOL_DEBUG_NVML_TRACE": str(trace)})
    a, b = pods.start(pod), pods.start(pod)
    run(a, 2.0)
    run(b, 2.0)
    finish(a)
    finish(b)
    log = kernel_log(pods.device)
    t0, t1 = min(start for _, start, _ in log) + 6 * S // 10, max(end for _, _, end in log) - S // 10
    busy = sum(max(0, min(end, t1) - max(start, t0)) for pid, start, end in log if pid in (a.pid, b.pid))
    rows = [line.split() for line in trace.read_text().splitlines() if line[:2] in ("E ", "S ")]
    events = sum(int(r[5]) for r in rows if r[0] == "E" and t0 <= int(r[4]) <= t1)
    learnt = sorted(float(r[6]) for r in rows if r[0] == "S" and t0 <= int(r[1]) <= t1)
    assert events > 0 and learnt
    assert learnt[len(learnt) // 2] == pytest.approx(busy / events, rel=0.15)


def test_elastic_lends_idle_time_and_gives_it_back(pods: PodFactory) -> None:
    lender = pods.start(pods.pod(cores="30", mode="elastic"))
    run(lender, 5.0)
    time.sleep(1.2)
    start, _ = active_window(pods.device, [lender.pid], 3 * S // 10, 0)
    alone = busy_share(pods.device, {lender.pid}, start, now_ns())
    neighbour = pods.start(pods.pod(cores="50"))
    # 3 s, not 1.5: the neighbour's pacing swings for its first ~0.7 s (NVML's 1/6 s samples: below its cap,
    # then the catch-up above it), which over a 1.3 s window measured 50-55 % on a 2-core machine and 50-51 %
    # over 2.8 s; the swing is part of what is measured, only its weight is smaller
    run(neighbour, 3.0)
    finish(neighbour)
    finish(lender)
    assert alone > 0.85  # nobody else wanted the GPU: the elastic pod used it
    # the neighbour gets its cap from its first 100 ms on, and the lender keeps only what is left
    window = active_window(pods.device, [neighbour.pid], S // 10, S // 10)
    assert busy_share(pods.device, {neighbour.pid}, *window) == pytest.approx(0.50, abs=0.05)
    assert 0.30 - 0.05 <= busy_share(pods.device, {lender.pid}, *window) < 0.55


def test_hard_never_borrows(pods: PodFactory) -> None:
    probe = pods.start(pods.pod(cores="30", mode="hard"))
    run(probe, 1.5)
    finish(probe)
    assert busy_share(pods.device, {probe.pid}, *active_window(pods.device, [probe.pid], 4 * S // 10, 0)) < 0.35


def test_a_bad_cores_value_logs_once_and_runs_unlimited(pods: PodFactory) -> None:
    probe = pods.start(pods.pod(cores="150", memory_mib="1024"))
    run(probe, 0.6)
    finish(probe)
    assert busy_share(pods.device, {probe.pid}, *active_window(pods.device, [probe.pid], S // 10, S // 20)) > 0.8
    assert probe.alloc("mem", 1 << 30)[0] == 0 and probe.alloc("mem", 1)[0] == 2  # memory stays capped
    err = probe.close()
    assert err.count("GPUPOOL_CORES_PERCENT") == 1 and "compute is not capped" in err
