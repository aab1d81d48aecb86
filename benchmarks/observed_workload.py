"""What the live scheduler gains by planning for the workload it observes (gpupool.scheduler.workload).

FGD judges a placement against a "typical workload". The simulator hands it the trace's own mix, known in
advance; a live scheduler does not know it. This replays FGD on a bundled trace (protocol of
gpupool.sim.replay, up to arrived = 100 %) three ways:
  default  - the fixed DEFAULT_WORKLOAD (whole, half and quarter GPUs), what the scheduler had before;
  observed - ObservedWorkload fed with each pod as it arrives, as the scheduler's filter does;
  oracle   - the trace's typical workload (the simulator's and the FGD paper's setting).
Prints unallocated GPU % at arrived = 100 % per seed and the mean; last line one JSON object
mode -> mean.  Usage: python benchmarks/observed_workload.py [--trace default] [--seeds 42,43,44,45]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import numpy as np

from gpupool.core.frag import DEFAULT_WORKLOAD
from gpupool.core.model import PodRequest
from gpupool.core.placement import Placement, place
from gpupool.core.policies import get_policy
from gpupool.core.policy import PolicyContext
from gpupool.scheduler.workload import ObservedWorkload
from gpupool.sim.replay import setup
from gpupool.sim.trace import NODES_FILE, TRACE_DIR, load_nodes, load_pods, resolve_trace

MODES = ("default", "observed", "oracle")


def unallocated_at_100(nodes: list, pods: list[PodRequest], mode: str, seed: int) -> float:
    run = setup(nodes, pods, seed)  # the simulator's draws: same pods, order and node rank
    state, submitted, capacity, rank = run.state, run.submitted, run.capacity_milli, run.ctx.rank
    policy = get_policy("fgd")
    observed = ObservedWorkload()
    ctx = run.ctx if mode == "oracle" else PolicyContext(rng=run.ctx.rng, workload=DEFAULT_WORKLOAD, rank=rank)
    mix = observed.current
    arrived = 0
    allocated_in_bucket: list[float] = []
    for k, pod in enumerate(submitted):
        if mode == "observed":
            observed.observe(str(k), pod)
            if observed.current is not mix:  # a new mix: fresh context (its caches are stale)
                mix = observed.current
                ctx = PolicyContext(rng=ctx.rng, workload=mix, rank=rank)
        arrived += pod.gpu.total_milli
        decision = place(state, pod, policy, ctx)
        if isinstance(decision, Placement):
            state.allocate(pod, decision.allocation)
        bucket = round(100 * arrived / capacity)
        if bucket == 100:
            allocated_in_bucket.append(100 * state.allocated_milli() / capacity)
        elif bucket > 100:
            break
    return 100 - float(np.mean(allocated_in_bucket))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default="default")
    ap.add_argument("--seeds", default="42,43,44,45")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    nodes = load_nodes(TRACE_DIR / NODES_FILE)
    pods = load_pods(resolve_trace(args.trace))
    print(f"cores: {os.cpu_count()}; trace {args.trace}; policy fgd; seeds {seeds}")
    means = {}
    for mode in MODES:
        values = [unallocated_at_100(nodes, pods, mode, s) for s in seeds]
        means[mode] = round(statistics.mean(values), 3)
        print(f"{mode:9s} " + " ".join(f"{v:.2f}" for v in values) + f"  mean {means[mode]:.2f}", flush=True)
    print(json.dumps(means))


if __name__ == "__main__":
    main()
