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

With --breakdown (default: fgd,gpupool on seed 42), each policy is also replayed up to arrived = 100 %
and its idle GPU compute is sorted by where it sits, to show which part of it the estimate says is
unavoidable.
Usage: python benchmarks/unallocated_bound.py [--seeds 42,43] [--traces default] [--breakdown fgd]
Last line: one JSON object, trace -> mean estimate (% of the cluster's GPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Sequence

import numpy as np

from gpupool.core.model import MILLI_PER_GPU, Node, PodRequest
from gpupool.core.placement import Placement, place
from gpupool.core.policies import get_policy
from gpupool.core.state import ClusterState
from gpupool.sim.replay import setup
from gpupool.sim.trace import BUNDLED, NODES_FILE, TRACE_DIR, load_nodes, load_pods, resolve_trace

HALF = MILLI_PER_GPU // 2
FEW_CORES = 8000  # an idle GPU on a node with less free CPU than this is counted as stranded by CPU


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


def idle_breakdown(nodes: Sequence[Node], pods: Sequence[PodRequest], policy: str, seed: int) -> dict[str, float]:
    """Replay (the simulator's protocol) until arrived demand passes 100 %, then sort idle GPU compute by
    what shares the GPU it sits on: % of the cluster's GPUs per class, plus the dropped demand."""
    run = setup(nodes, pods, seed)
    state, submitted, ctx, capacity = run.state, run.submitted, run.ctx, run.capacity_milli
    chosen = get_policy(policy)
    arrived = dropped = 0
    for pod in submitted:
        demand = pod.gpu.count * pod.gpu.milli if pod.gpu.count else 0
        if arrived + demand > capacity:
            break
        arrived += demand
        decision = place(state, pod, chosen, ctx)
        if isinstance(decision, Placement):
            state.allocate(pod, decision.allocation)
        else:
            dropped += demand
    on_gpu: dict[tuple[int, int], list[int]] = {}
    for held in state.held.values():
        for g in held.allocation.grants:
            on_gpu.setdefault((held.node_index, g.index), []).append(g.milli)
    classes: dict[str, float] = {"dropped demand": 100.0 * dropped / capacity}
    for i, n in enumerate(state.nodes):
        for j in range(len(n.gpus)):
            free = int(state.gpu_milli_free[i, j])
            if not free:
                continue
            shares = on_gpu.get((i, j), [])
            biggest = max(shares, default=0)
            if not shares:
                key = "idle GPU, node < 8 free cores" if state.cpu_free[i] < FEW_CORES else "idle GPU"
            elif biggest > HALF:
                key = f"remainder next to a {biggest / MILLI_PER_GPU:.2f} share"
            else:
                key = "GPU with only shares <= 0.5"
            classes[key] = classes.get(key, 0.0) + 100.0 * free / capacity
    return classes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default=",".join(str(s) for s in range(42, 52)))
    ap.add_argument("--traces", default=",".join(BUNDLED))
    ap.add_argument("--breakdown", default="fgd,gpupool", help="policies replayed for the idle breakdown")
    ap.add_argument("--breakdown-seed", type=int, default=42)
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
            submitted = setup(nodes, pods, seed).submitted
            shares, arrived = arrived_shares(submitted, capacity)
            remainder, empty = unfillable_milli(shares)
            big = sum(1 for s in shares if s > HALF)
            values.append(100.0 * empty / capacity)
            print(f"{seed:>4} {arrived:8.2f} {big:>10} {100.0 * remainder / capacity:10.2f} {values[-1]:9.2f}")
        summary[trace] = round(statistics.fmean(values), 3)
        print(f"mean {summary[trace]:.2f} (min {min(values):.2f}, max {max(values):.2f})")
        for policy in filter(None, a.breakdown.split(",")):
            classes = idle_breakdown(nodes, pods, policy, a.breakdown_seed)
            idle = sum(v for k, v in classes.items() if k != "dropped demand")
            print(f"{policy}, seed {a.breakdown_seed}, arrived <= 100 %: idle {idle:.2f} % of GPUs "
                  f"(dropped demand {classes['dropped demand']:.2f} %), by where it sits:")
            ranked = sorted(((k, v) for k, v in classes.items() if k != "dropped demand"), key=lambda kv: -kv[1])
            for key, value in ranked[:8]:
                print(f"  {value:6.2f}  {key}")
            rest = sum(v for _, v in ranked[8:])
            if rest:
                print(f"  {rest:6.2f}  other")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
