"""Compute shares of `hook` isolation on the simulated GPU (tests/native/fakes), over the simulated GPU's
parameter sweep (fake_state.h): the driver's NVML sample period, per-process phases, lag, repeats, the
SM-utilisation scale, time-slicing between contexts with a switch cost, MIG mode.

Every tenant saturates the device: kernels in a loop, a stream sync every 16 launches (a queue of up to
32 ms of 2 ms kernels per tenant). Each pod's processes run in a PID namespace of their own (NVML names them
by host PIDs that differ from their getpid(), as in a real pod). Per setting and case it prints each
tenant's cap, its measured share (device time from the fake device's own kernel log, from 0.5 s after the
last tenant's first kernel to 0.1 s before the first one's last), the library's own estimate (the busy time
the library accounted for the pod, usage.v1 busy_ns, over the pod's whole run) and the error (measured -
cap); each figure is the median of --runs runs. Pass mark: every tenant within --tolerance points of its
cap. When caps add up to 100 they cannot all be met on a time-sliced GPU (every context switch costs
device time nobody gets): every tenant but the largest within the tolerance, the largest at most its cap
+ the tolerance, and together >= 95 % of what the same tenants use uncapped (measured too). Elastic: from
200 ms after the hard neighbour's first kernel, the neighbour at most its cap + the tolerance, the elastic
pod within the tolerance of its cap, the two within 5 points of what they may use together; alone, the
elastic pod >= 90 %.

    python benchmarks/isolation_sim.py [--runs 3] [--seconds 4] [--profile NAME ...] [--case TEXT]
    GPUPOOL_TEST_NATIVE_SRC=/path/to/other/native python benchmarks/isolation_sim.py --profile h100 ...

GPUPOOL_TEST_NATIVE_SRC builds the library from another copy of native/ (tests/native/native_helpers.py):
how the `h100` profile was shown to reproduce the H100 figures with the library that ran there
(docs/concepts.md). The last line is one JSON object."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from tests.native.native_helpers import (  # noqa: E402
    Built,
    Pod,
    Probe,
    active_window,
    build_all,
    busy_share,
    kernel_log,
)

S = 1_000_000_000
PID_NS_STEP = 10_000_000
SYNC_EVERY = 16  # launches between stream syncs: a 32 ms device queue per tenant
BUSY_NS_OFFSET = 304 + 40  # usage.v1: dev[0].busy_ns (native/gp.h)
NVML_SCALE_OFFSET = 1816  # limits.v1: nvml_scale_ppm[0] (native/gp.h)
AGENT_SCALE = "agent-scale"  # not an environment variable: written into each pod's limits.v1

# The simulated GPU's settings (fake_state.h). {} is the fake's default, the realistic one.
PROFILES: dict[str, dict[str, str]] = {
    # the fake before issue 38: one aligned 10 ms sample per process, exact, FIFO kernels, free switches
    "ideal": {"FAKE_GPU_PERIOD_US": "10000", "FAKE_GPU_ALIGNED": "1", "FAKE_GPU_LAG_US": "0",
              "FAKE_GPU_NVML_REPEAT": "0", "FAKE_GPU_TIMESLICE_US": "0", "FAKE_GPU_SWITCH_US": "0"},
    "default": {},  # 166 ms periods at per-process phases, 10 ms lag, repeats, 2 ms slices, 50 us switches
    "period-10ms": {"FAKE_GPU_PERIOD_US": "10000"},
    "period-1s": {"FAKE_GPU_PERIOD_US": "1000000", "FAKE_GPU_LAG_US": "50000"},
    "latest-only": {"FAKE_GPU_NVML_SAMPLES": "latest"},
    "scale-71": {"FAKE_GPU_SM_SCALE_PCT": "71"},
    "scale-130-uncapped": {"FAKE_GPU_SM_SCALE_PCT": "130", "FAKE_GPU_SM_UNCAPPED": "1"},
    "slice-1ms-switch-200us": {"FAKE_GPU_TIMESLICE_US": "1000", "FAKE_GPU_SWITCH_US": "200"},
    "mig": {"FAKE_GPU_MIG": "1"},
    # what reproduces the H100 run of the library before issue 38 alone (docs/concepts.md): the driver's
    # 1/6 s samples at their own phases, only the newest returned, smUtil at 0.71 of the busy share, 2 ms
    # slices with 200 us switches
    "h100": {"FAKE_GPU_SM_SCALE_PCT": "71", "FAKE_GPU_NVML_SAMPLES": "latest", "FAKE_GPU_SWITCH_US": "200"},
    # the same, with the agent's limits.v1 giving each pod NVML's scale (native/gp.h nvml_scale_ppm): what
    # tenants that never run alone need to be exact there
    "h100-agent-scale": {"FAKE_GPU_SM_SCALE_PCT": "71", "FAKE_GPU_NVML_SAMPLES": "latest",
                         "FAKE_GPU_SWITCH_US": "200", AGENT_SCALE: "710000"},
}


@dataclass(frozen=True)
class Tenant:
    cores: float
    processes: int = 1
    workload: str = "kernel"  # kernel (2 ms), graph (2 ms graphs), mixed (0.1-20 ms kernels and graphs)
    mode: str = "hard"


CASES: dict[str, list[Tenant]] = {
    "10 alone": [Tenant(10)],
    "30 alone": [Tenant(30)],
    "50 alone": [Tenant(50)],
    "70 alone": [Tenant(70)],
    "75 alone": [Tenant(75)],
    "30/70": [Tenant(30), Tenant(70)],
    "10/90": [Tenant(10), Tenant(90)],
    "20/30": [Tenant(20), Tenant(30)],
    "25/25/25": [Tenant(25), Tenant(25), Tenant(25)],
    "pod of two at 40 beside 60": [Tenant(40, processes=2), Tenant(60)],
    "graphs 30/70": [Tenant(30, workload="graph"), Tenant(70, workload="graph")],
    "mixed kernels 30/70": [Tenant(30, workload="mixed"), Tenant(70, workload="mixed")],
}
ELASTIC = {"elastic 30 beside hard 50": (30, 50), "elastic 30 beside hard 70": (30, 70),
           "elastic 10 beside hard 90": (10, 90)}


def command(workload: str, seconds: float, seed: int) -> str:
    if workload == "mixed":
        return f"mixed {seconds} {seed} {SYNC_EVERY}"
    return f"launch {workload} 2000 {seconds} {SYNC_EVERY}"


def finish(probe: Probe) -> None:
    assert probe.proc.stdout is not None
    line = probe.proc.stdout.readline().split()
    if not line or line[0] != "0":
        raise SystemExit(f"a tenant failed: {line} {probe.close()}")


class Run:
    def __init__(self, built: Built, root: Path, gpu: dict[str, str]) -> None:
        self.built, self.root, self.gpu = built, root, gpu
        self.device = root / "gpu"
        self.count = 0
        self.probes: list[Probe] = []
        self.pods: list[Pod] = []

    def pod(self, cores: float, mode: str = "hard") -> Pod:
        self.count += 1
        hook = self.root / f"pod-{self.count}"
        hook.mkdir()
        env = {k: v for k, v in self.gpu.items() if k != AGENT_SCALE}
        pod = Pod(self.built, self.device, hook, cores=f"{cores:g}", mode=mode, granted=True,
                  pid_ns=PID_NS_STEP * self.count, gpu=env)
        if AGENT_SCALE in self.gpu:
            path = pod.write_limits()
            data = bytearray(path.read_bytes())
            struct.pack_into("<Q", data, NVML_SCALE_OFFSET, int(self.gpu[AGENT_SCALE]))
            path.chmod(0o644)
            path.write_bytes(bytes(data))
        self.pods.append(pod)
        return pod

    def start(self, pod: Pod) -> Probe:
        probe = pod.start()
        self.probes.append(probe)
        return probe

    def close(self) -> None:
        for probe in self.probes:
            if probe.proc.poll() is None:
                probe.proc.kill()
            probe.close()


def library_estimate(run: Run, pod: Pod, pids: set[int]) -> float:
    """The busy time the library accounted for the pod (usage.v1), as a share of the pod's whole run."""
    log = [(s, e) for p, s, e in kernel_log(run.device) if p in pids]
    span = max(e for _, e in log) - min(s for s, _ in log)
    try:
        (busy,) = struct.unpack_from("<Q", (pod.accounting / "usage.v1").read_bytes(), BUSY_NS_OFFSET)
    except (OSError, struct.error):
        return float("nan")
    return 100 * int(busy) / span


def shares(built: Built, tenants: list[Tenant], gpu: dict[str, str], seconds: float,
           seed: int, uncapped: bool = False) -> list[tuple[float, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        run = Run(built, Path(tmp), gpu)
        try:
            groups = []
            for t in tenants:
                pod = run.pod(100 if uncapped else t.cores, t.mode)
                groups.append((pod, [run.start(pod) for _ in range(t.processes)]))
            for (_, g), t in zip(groups, tenants, strict=True):
                for k, p in enumerate(g):
                    p.send(command(t.workload, seconds, seed + k))
            for _, g in groups:
                for p in g:
                    finish(p)
            pids = [p.pid for _, g in groups for p in g]
            window = active_window(run.device, pids, 5 * S // 10, S // 10)
            return [(100 * busy_share(run.device, {p.pid for p in g}, *window),
                     library_estimate(run, pod, {p.pid for p in g})) for pod, g in groups]
        finally:
            run.close()


def elastic(built: Built, lender_cap: int, hard_cap: int, gpu: dict[str, str],
            seconds: float) -> tuple[float, float, float]:
    """The elastic pod alone for 1.2 s, then a hard neighbour for `seconds`: (elastic alone, neighbour from
    200 ms after its first kernel, elastic meanwhile)."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Run(built, Path(tmp), gpu)
        try:
            lender = run.start(run.pod(lender_cap, "elastic"))
            lender.send(command("kernel", seconds + 1.6, 1))
            time.sleep(1.2)  # a schedule, not a synchronisation: the lender runs alone this long
            start, _ = active_window(run.device, [lender.pid], 3 * S // 10, 0)
            alone = 100 * busy_share(run.device, {lender.pid}, start, time.monotonic_ns())
            neighbour = run.start(run.pod(hard_cap))
            neighbour.send(command("kernel", seconds, 2))
            finish(neighbour)
            finish(lender)
            window = active_window(run.device, [neighbour.pid], 2 * S // 10, S // 10)
            return (alone, 100 * busy_share(run.device, {neighbour.pid}, *window),
                    100 * busy_share(run.device, {lender.pid}, *window))
        finally:
            run.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--tolerance", type=float, default=2.0)
    parser.add_argument("--profile", action="append", choices=sorted(PROFILES),
                        help="settings of the simulated GPU (repeat; default: all)")
    parser.add_argument("--case", action="append", default=[],
                        help="run only cases whose name contains this (repeat)")
    args = parser.parse_args()
    src = os.environ.get("GPUPOOL_TEST_NATIVE_SRC") or str(ROOT / "native")
    print(f"CPU cores: {os.cpu_count()} (load average {os.getloadavg()[0]:.1f}); runs per figure: {args.runs}; "
          f"{args.seconds:g} s per run; library from {src}; tolerance +-{args.tolerance:g} points")
    results: dict[str, Any] = {}
    ok = True
    worst = 0.0

    def wanted(name: str) -> bool:
        return not args.case or any(c in name for c in args.case)

    with tempfile.TemporaryDirectory() as tmp:
        built = build_all(Path(tmp) / "build")
        for profile in args.profile or list(PROFILES):
            gpu = PROFILES[profile]
            print(f"\nsimulated GPU: {profile} {' '.join(f'{k}={v}' for k, v in gpu.items()) or '(defaults)'} "
                  f"(load average {os.getloadavg()[0]:.1f})")
            for name, tenants in CASES.items():
                if not wanted(name):
                    continue
                runs = [shares(built, tenants, gpu, args.seconds, 7 + r) for r in range(args.runs)]
                med = [statistics.median(r[i][0] for r in runs) for i in range(len(tenants))]
                est = [statistics.median(r[i][1] for r in runs) for i in range(len(tenants))]
                caps = [t.cores for t in tenants]
                errors = [m - c for m, c in zip(med, caps, strict=True)]
                good = all(abs(e) <= args.tolerance for e in errors)
                graded = errors
                note = ""
                if sum(caps) == 100:
                    # A time-sliced GPU loses device time at every context switch, so caps adding up to 100
                    # cannot all be met: the largest tenant is held to at most its cap + tolerance, the
                    # others within the tolerance, and together they must use >= 95 % of what the same
                    # tenants use uncapped (work-conserving).
                    reference = statistics.median(
                        sum(x[0] for x in shares(built, tenants, gpu, args.seconds, 7 + r, uncapped=True))
                        for r in range(args.runs))
                    largest = caps.index(max(caps))
                    graded = [e for k, e in enumerate(errors) if k != largest]
                    good = (all(abs(e) <= args.tolerance for e in graded) and errors[largest] <= args.tolerance
                            and sum(med) >= 0.95 * reference)
                    note = f" (uncapped {reference:.1f}: {100 * sum(med) / reference:.1f} % of it)"
                ok &= good
                worst = max([worst, *(abs(e) for e in graded)])
                cells = ", ".join(f"cap {c:g} measured {m:.1f} library {e:.1f} error {m - c:+.1f}"
                                  for c, m, e in zip(caps, med, est, strict=True))
                print(f"  {name:28s} {cells}; total {sum(med):.1f}{note} {'ok' if good else 'OUT'}")
                results[f"{profile}: {name}"] = {
                    "caps": caps, "measured": [round(m, 2) for m in med], "library": [round(e, 2) for e in est],
                    "error": [round(e, 2) for e in errors], "ok": good}
            for name, (lender_cap, hard_cap) in ELASTIC.items():
                if not wanted(name):
                    continue
                runs3 = [elastic(built, lender_cap, hard_cap, gpu, args.seconds) for _ in range(args.runs)]
                alone, hard, lent = (statistics.median(r[i] for r in runs3) for i in range(3))
                # the hard neighbour at most its cap + tolerance, the elastic pod within the tolerance of its
                # own cap while it shares the GPU, the two together within 5 points of what they may use
                # (a time-sliced GPU's switches cost device time); alone the elastic pod had >= 90 %
                good = (hard <= hard_cap + args.tolerance and abs(lent - lender_cap) <= args.tolerance
                        and hard + lent >= min(100, hard_cap + lender_cap) - 5 and alone >= 90)
                ok &= good
                worst = max(worst, abs(lent - lender_cap), max(0.0, hard - hard_cap))
                print(f"  {name:28s} elastic alone {alone:.1f}, then cap {hard_cap} measured {hard:.1f} error "
                      f"{hard - hard_cap:+.1f} beside elastic {lent:.1f} {'ok' if good else 'OUT'}")
                results[f"{profile}: {name}"] = {"elastic_alone": round(alone, 2), "hard": round(hard, 2),
                                                 "elastic_beside": round(lent, 2), "ok": good}
    print(json.dumps({"cpu_cores": os.cpu_count(), "runs": args.runs, "seconds": args.seconds, "library": src,
                      "max_error_points": round(worst, 2), "all_within_tolerance": ok, "cases": results}))


if __name__ == "__main__":
    main()
