"""How low could unallocated GPU % at arrived = 100 % go? A relaxed offline estimate per bundled trace.

For each seed, take the pods that arrive until their GPU demand reaches the cluster's capacity (the same
shuffle and top-up as the replay). Relaxations: CPU, memory, GPU models, node boundaries and the order of
arrival are ignored, and small pods may be split. What is left is the one waste nobody can avoid: a
sharing pod above half a GPU needs a GPU of its own, and its remainder (1000 - milli) can hold only pods
no larger than that remainder. Remainders are filled smallest first from the pool of small (<= 500 milli)
pods that fit them, fractionally; whatever stays empty is the estimate.

It assumes every arrived pod is placed. An online policy cannot refuse a pod that fits, but at the end
of a replay it may drop a big share it could not fit and so never create that remainder, so this is an
estimate of the floor, not a proof that no replay can go lower.
Usage: python benchmarks/unallocated_bound.py [--seeds 42,43] [--traces default]
Last line: one JSON object, trace -> mean estimate (% of the cluster's GPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Sequence

import numpy as np

from gpupool.core.model import MILLI_PER_GPU, PodRequest
from gpupool.core.state import ClusterState
from gpupool.sim.replay import workload_for
from gpupool.sim.trace import BUNDLED, NODES_FILE, TRACE_DIR, load_nodes, load_pods, resolve_trace

HALF = MILLI_PER_GPU // 2


def arrived_shares(submitted: Sequence[PodRequest], capacity_milli: int) -> tuple[list[int], float]:
    """Per-GPU milli of the one-GPU sharing pods among those arriving before demand passes capacity,
    and the arrived demand as % of capacity."""
    total = 0
    shares = []
    for p in submitted:
        demand = p.gpu.count * p.gpu.milli if p.gpu.count else 0
        if total + demand > capacity_milli:
            break
        total += demand
        if p.gpu.count == 1 and p.gpu.milli < MILLI_PER_GPU:
            shares.append(p.gpu.milli)
    return shares, 100.0 * total / capacity_milli


def unfillable_milli(shares: Sequence[int]) -> tuple[int, float]:
    """(sum of the remainders next to shares above half a GPU, the part of it small shares cannot fill).
    Remainders ascending; each takes what it can from the pool of small shares that fit it. The pool only
    grows as remainders grow, so this greedy fill is the largest fractional fill."""
    arr = np.asarray(shares, dtype=np.int64)
    remainders = np.sort(MILLI_PER_GPU - arr[arr > HALF])
    small = np.sort(arr[arr <= HALF])
    pool = 0.0
    filled = 0.0
    j = 0
    for r in remainders:
        while j < len(small) and small[j] <= r:
            pool += float(small[j])
            j += 1
        take = min(float(r), pool)
        pool -= take
        filled += take
    return int(remainders.sum()), float(remainders.sum()) - filled


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default=",".join(str(s) for s in range(42, 52)))
    ap.add_argument("--traces", default=",".join(BUNDLED))
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    nodes = load_nodes(TRACE_DIR / NODES_FILE)
    capacity = ClusterState(nodes).total_gpus * MILLI_PER_GPU
    print(f"cores: {os.cpu_count()}; seeds: {seeds}; capacity: {capacity // MILLI_PER_GPU} GPUs")
    summary: dict[str, float] = {}
    for trace in a.traces.split(","):
        pods = load_pods(resolve_trace(trace))
        print(f"\n{trace}: relaxed estimate of unallocated GPU % at arrived = 100 %")
        print(f"{'seed':>4} {'arrived%':>8} {'big shares':>10} {'remainder%':>10} {'estimate%':>9}")
        values = []
        for seed in seeds:
            submitted = workload_for(pods, capacity, np.random.default_rng(seed))
            shares, arrived = arrived_shares(submitted, capacity)
            remainder, empty = unfillable_milli(shares)
            big = sum(1 for s in shares if s > HALF)
            values.append(100.0 * empty / capacity)
            print(f"{seed:>4} {arrived:8.2f} {big:>10} {100.0 * remainder / capacity:10.2f} {values[-1]:9.2f}")
        summary[trace] = round(statistics.fmean(values), 3)
        print(f"mean {summary[trace]:.2f} (min {min(values):.2f}, max {max(values):.2f})")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
