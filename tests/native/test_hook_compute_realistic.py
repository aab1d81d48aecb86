"""Compute caps on a simulated GPU that behaves like a real one (issue 38; fake_state.h documents it): NVML
samples each process on the driver's own clock (1/6 s by default) at its own phase, as a mean since its
previous sample, visible after a lag and repeated; smUtil may be scaled; contexts of different processes
are time-sliced with a cost at every switch; in MIG mode there are no per-process samples. A few points of
the sweep run here (the whole sweep is benchmarks/isolation_sim.py):

    default     the fake's defaults (166 ms periods, 10 ms lag, repeats, 2 ms slices, 50 us switches)
    h100        smUtil at 0.71 of the busy share, only the newest sample returned, 200 us switches: what
                reproduces the H100 figures of the library before issue 38 (docs/concepts.md)
    period-1s   1 s sample periods with a 50 ms lag (the slowest drivers)
    mig         MIG mode: no per-process samples at all

Every test here failed with the library before issue 38 (GPUPOOL_TEST_NATIVE_SRC pointing at a copy of its
native/) under at least one of these settings: h100 and mig alone, default and h100 shared.

Shares are read from the fake device's own kernel log. Every tenant saturates (kernels in a loop, a stream
sync every 16 launches). Runs are 3 s, measured from 0.5 s after the last tenant's first kernel to 0.1 s
before the first one's last (2.4 s): the library settles within a sample period or two (1/6 s here).
Tolerance: 2 points per tenant, the issue's for 10 s windows, on 2.4 s windows: what is left of a start-up
error (the events measure from the first launch, NVML's scale is learnt within 0.2 s) spread over 2.4 s
instead of 10 s is under a point. With 1 s periods the tenants learn that they share the GPU only a second
after they start; what they under-use meanwhile (their events also count the others' slices) comes back
as credit afterwards, so those runs are 4 s, measured over 3.4 s, long enough to hold both.

Caps here never add up to 100: on a time-sliced GPU every context switch costs device time nobody gets, so
a set of caps adding up to 100 cannot all be met (test_hook_compute_exact.py)."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest

from tests.native.conftest import PodFactory
from tests.native.native_helpers import Pod, Probe, active_window, busy_share, kernel_log

S = 1_000_000_000
TOL = 0.02
GPUS: dict[str, dict[str, str]] = {
    "default": {},
    "h100": {"FAKE_GPU_SM_SCALE_PCT": "71", "FAKE_GPU_NVML_SAMPLES": "latest", "FAKE_GPU_SWITCH_US": "200"},
    "period-1s": {"FAKE_GPU_PERIOD_US": "1000000", "FAKE_GPU_LAG_US": "50000"},
    "mig": {"FAKE_GPU_MIG": "1"},
}
NVML_SCALE_OFFSET = 1816  # limits.v1: nvml_scale_ppm[] (native/gp.h), written by the agent


def timing(gpu: str) -> tuple[float, int]:
    """Run length (s) and how much of its start is not measured (ns)."""
    return (4.0, 5 * S // 10) if gpu == "period-1s" else (3.0, 5 * S // 10)


def run_all(probes: list[Probe], workload: str, seconds: float) -> None:
    for k, p in enumerate(probes):
        p.send(workload.format(s=seconds, seed=7 + k))
    for p in probes:
        assert p.proc.stdout is not None
        line = p.proc.stdout.readline().split()
        assert line and line[0] == "0", (line, p.stderr())


def shares(pods: PodFactory, groups: list[set[int]], skip: int) -> list[float]:
    pids = [pid for g in groups for pid in g]
    window = active_window(pods.device, pids, skip, S // 10)
    return [busy_share(pods.device, g, *window) for g in groups]


def with_agent_scale(pod: Pod, scale_ppm: int) -> Pod:
    """The agent's limits file with NVML's smUtil scale on GPU 0, as its validation probe measured it."""
    path = pod.write_limits()
    data = bytearray(path.read_bytes())
    struct.pack_into("<Q", data, NVML_SCALE_OFFSET, scale_ppm)
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    return pod


@pytest.mark.parametrize("gpu", ["default", "h100", "period-1s", "mig"])
@pytest.mark.parametrize("cap", [10, 30, 75])
def test_a_tenant_alone_gets_its_cap(pods: PodFactory, cap: int, gpu: str) -> None:
    """1 ms kernels (the library's first guess is 2 ms: without a measurement it would pace at half)."""
    seconds, skip = timing(gpu)
    probe = pods.start(pods.pod(cores=str(cap), granted=True, gpu=GPUS[gpu]))
    run_all([probe], "launch kernel 1000 {s} 16", seconds)
    (got,) = shares(pods, [{probe.pid}], skip)
    assert got == pytest.approx(cap / 100, abs=TOL)


@pytest.mark.parametrize(("caps", "gpu"), [([20, 30], "default"), ([20, 30], "h100"), ([25, 25, 25], "default"),
                                           ([20, 30], "period-1s")])
def test_tenants_sharing_the_gpu_each_get_their_cap(pods: PodFactory, caps: list[int], gpu: str) -> None:
    """Tenants that start together and never run alone: on the h100 setting the pods learn nothing of NVML's
    scale themselves, and take the one the agent measured (limits.v1); the others need none."""
    seconds, skip = timing(gpu)
    pod_list = [pods.pod(cores=str(c), granted=True, gpu=GPUS[gpu]) for c in caps]
    if gpu == "h100":
        pod_list = [with_agent_scale(p, 710_000) for p in pod_list]
    probes = [pods.start(p) for p in pod_list]
    run_all(probes, "launch kernel 2000 {s} 16", seconds)
    got = shares(pods, [{p.pid} for p in probes], skip)
    for share, cap in zip(got, caps, strict=True):
        assert share == pytest.approx(cap / 100, abs=TOL), got


def test_a_tenant_alone_first_keeps_its_cap_when_another_joins(pods: PodFactory) -> None:
    """h100 setting, no scale from the agent: the first tenant learns NVML's scale while alone and keeps its
    cap once the GPU is shared; the second, which never ran alone, is not held here (docs/concepts.md)."""
    gpu = GPUS["h100"]
    first = pods.start(pods.pod(cores="30", granted=True, gpu=gpu))
    first.send("launch kernel 2000 4.0 16")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until the device log holds 1 s of the first tenant's kernels
        log = kernel_log(pods.device) if pods.device.exists() else []
        if log and max(e for _, _, e in log) - min(s for _, s, _ in log) > S:
            break
        time.sleep(0.02)
    second = pods.start(pods.pod(cores="20", granted=True, gpu=gpu))
    second.send("launch kernel 2000 2.5 16")
    for p in (second, first):
        assert p.proc.stdout is not None and p.proc.stdout.readline().split()[0] == "0"
    window = active_window(pods.device, [second.pid], 5 * S // 10, S // 10)
    assert busy_share(pods.device, {first.pid}, *window) == pytest.approx(0.30, abs=TOL)


@pytest.mark.parametrize("workload", ["launch graph 2000 {s} 16", "mixed {s} {seed} 16"], ids=["graphs", "mixed"])
def test_graphs_and_mixed_kernels(pods: PodFactory, workload: str) -> None:
    seconds, skip = timing("default")
    probes = [pods.start(pods.pod(cores=str(c), granted=True)) for c in (20, 30)]
    run_all(probes, workload, seconds)
    low, high = shares(pods, [{p.pid} for p in probes], skip)
    assert low == pytest.approx(0.20, abs=TOL)
    assert high == pytest.approx(0.30, abs=TOL)


def test_a_pod_of_two_processes_beside_another_pod(pods: PodFactory) -> None:
    seconds, skip = timing("default")
    pod = pods.pod(cores="30", granted=True)
    a, b = pods.start(pod), pods.start(pod)
    c = pods.start(pods.pod(cores="20", granted=True))
    run_all([a, b, c], "launch kernel 2000 {s} 16", seconds)
    two, one = shares(pods, [{a.pid, b.pid}, {c.pid}], skip)
    assert two == pytest.approx(0.30, abs=TOL)
    assert one == pytest.approx(0.20, abs=TOL)


def test_the_debug_trace(pods: PodFactory, tmp_path: Path) -> None:
    """GPUPOOL_DEBUG_NVML_TRACE (native/gp.h): every NVML sample the pod's poller read, one line each, and
    the events' spans; the pod's own samples are marked with its host PID (getpid() + its namespace's
    offset), the charge never decreases."""
    trace = tmp_path / "trace"
    pod = pods.pod(cores="30", granted=True, extra={"GPUPOOL_DEBUG_NVML_TRACE": str(trace)})
    probe = pods.start(pod)
    run_all([probe], "launch kernel 2000 {s} 16", 1.0)
    probe.close()
    lines = trace.read_text().splitlines()
    assert lines[0].startswith("#")
    samples = [x.split() for x in lines if x[0].isdigit()]
    spans = [x.split() for x in lines if x.startswith("E ")]
    assert samples and spans
    host = probe.pid + pod.pid_ns
    assert all(len(x) == 6 for x in samples)
    assert {int(x[1]) for x in samples if x[4] == "1"} == {host}
    charges = [int(x[5]) for x in samples]
    assert charges == sorted(charges) and charges[-1] > 0
    assert all(len(x) == 6 and int(x[3]) <= int(x[4]) for x in spans)


def test_the_debug_trace_stops_at_64_mib(pods: PodFactory, tmp_path: Path) -> None:
    """A trace that is already 64 MiB gets nothing more, not even a header; beside it a pod with an empty
    one gets its lines (so the first is not empty for want of writing at all)."""
    full, empty = tmp_path / "full", tmp_path / "empty"
    with full.open("wb") as f:
        f.truncate(64 << 20)  # sparse
    probes = [pods.start(pods.pod(cores="30", granted=True, extra={"GPUPOOL_DEBUG_NVML_TRACE": str(path)}))
              for path in (full, empty)]
    run_all(probes, "launch kernel 2000 {s} 16", 0.5)
    for probe in probes:
        probe.close()
    assert full.stat().st_size == 64 << 20
    assert empty.exists() and empty.read_text().startswith("#") and len(empty.read_text().splitlines()) > 1


def test_thirty_seventy_with_1s_samples_holds_once_both_have_samples(pods: PodFactory, tmp_path: Path) -> None:
    """1 s sample periods, 30/70 starting together, from 3.5 s on (both have had three samples of the other):
    the tenant at 30 within 3 points in every half second (3 more above while the credit of its start-up is
    paid out, native/gp_compute.c RELEASE_PPM), and neither pod ever takes NVML's scale for other than 1
    (what the simulated GPU reports). With NVML's busy time arriving a second at a time, the library before
    this test compared it with the wall time polled so far and took a scale of 1.11 after every sample (its
    trace), so the tenant at 30 ran 34-37 % every other half second. The first seconds are not held here: a
    pod learns it shares the GPU only from NVML's samples (docs/concepts.md)."""
    gpu = GPUS["period-1s"]
    traces = [tmp_path / "trace-30", tmp_path / "trace-70"]
    probes = [pods.start(pods.pod(cores=str(c), granted=True, gpu=gpu,
                                  extra={"GPUPOOL_DEBUG_NVML_TRACE": str(t)}))
              for c, t in zip((30, 70), traces, strict=True)]
    run_all(probes, "launch kernel 2000 {s} 16", 7.5)
    start, end = active_window(pods.device, [p.pid for p in probes], 35 * S // 10, S // 10)
    halves = [busy_share(pods.device, {probes[0].pid}, t, t + S // 2) for t in range(start, end - S // 2, S // 2)]
    assert len(halves) >= 6
    # within 3 points, and 3 more above while the credit its first samples gave back is paid out
    assert all(0.27 <= h <= 0.36 for h in halves), [round(h, 3) for h in halves]
    for trace in traces:
        scales = {int(x.split()[3]) for x in trace.read_text().splitlines() if x.startswith("S ")}
        assert scales == {1_000_000}, (trace.name, sorted(scales)[-3:])


def test_a_pod_of_two_processes_alone_on_a_mig_device(pods: PodFactory) -> None:
    """MIG mode: no per-process samples, so only the events measure. Each of the pod's two processes counts
    the time its work waits for the other's slices; summed, the pod counted more than its device time and held
    itself under its cap (the library before this test: 34.3 % at 40). United across the pod's processes,
    the spans are the pod's device time on an instance it has to itself."""
    seconds, skip = timing("mig")
    pod = pods.pod(cores="40", granted=True, gpu=GPUS["mig"])
    a, b = pods.start(pod), pods.start(pod)
    run_all([a, b], "launch kernel 2000 {s} 16", seconds)
    (got,) = shares(pods, [{a.pid, b.pid}], skip)
    assert got == pytest.approx(0.40, abs=TOL)


def one_second_shares(pods: PodFactory, groups: list[set[int]]) -> list[list[float]]:
    """Each group's share of every whole second from the last tenant's first kernel to 0.1 s before the first
    one's last."""
    start, end = active_window(pods.device, [pid for g in groups for pid in g], 0, S // 10)
    return [[busy_share(pods.device, g, t, t + S) for t in range(start, end - S + 1, S)] for g in groups]


@pytest.mark.parametrize("caps", [[30, 70], [10, 90]], ids=["30-70", "10-90"])
def test_1s_windows_with_1s_samples_from_the_second_after_the_first_samples(
        pods: PodFactory, caps: list[int]) -> None:
    """1 s sample periods, tenants starting together with caps adding up to 100. Before its first samples (a
    period, the lag and its phase after it starts: 1-2 s) a pod knows only that NVML lists another context,
    counts all its events (they also count the other's slices) and runs under its cap; its first samples
    give the difference back. The library before this test gave it back at once: the 30 ran 20-22 % in its
    first second, then 26 and 35.2 % or 29 and 39.8 %, and failed this test in 2 of 3 runs. Now it is paid
    out at most 3 points above the cap: from the third second on (the second after the first samples, at the
    latest) the smaller tenant holds 5 points in every 1 s window, the larger at most 5 over its cap, and the
    two use at least 90 % of the device. (10/90 held with that library too: it is here so that the change
    keeps it.)"""
    gpu = GPUS["period-1s"]
    probes = [pods.start(pods.pod(cores=str(c), granted=True, gpu=gpu)) for c in caps]
    run_all(probes, "launch kernel 2000 {s} 16", 6.0)
    low, high = one_second_shares(pods, [{p.pid} for p in probes])
    assert len(low) >= 5
    assert all(abs(x - caps[0] / 100) <= 0.05 for x in low[2:]), [round(x, 3) for x in low]
    assert all(x <= caps[1] / 100 + 0.05 for x in high[2:]), [round(x, 3) for x in high]
    together = [x + y for x, y in zip(low, high, strict=True)]
    assert all(x >= 0.90 for x in together[2:]), [round(x, 3) for x in together]
