"""How low could unallocated GPU % at arrived = 100 % go? Bounds per bundled trace (gpupool.sim.bound).

Per seed, on the pods that arrive until their GPU demand reaches the cluster's capacity (the replay's
shuffle and top-up), relaxing CPU, memory, models and node boundaries:
  estimate    shares above half a GPU each take a GPU; small shares, split at will, fill the remainders
              next to them; what stays empty (the quick estimate of the last session)
  any policy  proven: max(slack of the placed shares, demand of the dropped ones), least over every choice
              of what to drop; holds for every policy, online or not, even one that refuses pods that fit
  all placed  proven least slack when every arrived share is placed whole (integer program)
  filled      proven for policies that place every share arriving while some GPU still has room for the
              largest share (0.81 on the traces): once none has, every pod needing that much is dropped
Then each --breakdown policy is replayed until arrived demand reaches capacity: its idle compute (= its
unallocated), the least slack with which exactly the shares it placed could be packed (the pairing part
of its loss), and, for the first seed, where its idle compute sits.
Usage: python benchmarks/unallocated_bound.py [--seeds 42,43] [--traces default] [--breakdown fgd]
Needs the test extras (scipy). Last line: one JSON object, trace -> bound -> mean % of the cluster's GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Sequence

from gpupool.core.model import MILLI_PER_GPU, Node, PodRequest
from gpupool.core.placement import Placement, place
from gpupool.core.policies import get_policy
from gpupool.core.state import ClusterState
from gpupool.sim.bound import (
    HALF,
    arrived,
    arrived_shares,
    filled_until,
    fractional_slack,
    least_slack,
    least_unallocated,
)
from gpupool.sim.replay import setup
from gpupool.sim.trace import BUNDLED, NODES_FILE, TRACE_DIR, load_nodes, load_pods, resolve_trace

FEW_CORES = 8000  # an idle GPU on a node with less free CPU than this is counted as stranded by CPU
BOUNDS = ("estimate", "any policy", "all placed", "filled")


def replay_until_full(nodes: Sequence[Node], pods: Sequence[PodRequest], policy: str, seed: int) -> ClusterState:
    """The simulator's protocol, stopped before arrived demand passes the cluster's capacity."""
    run = setup(nodes, pods, seed)
    state, chosen = run.state, get_policy(policy)
    for pod in arrived(run.submitted, run.capacity_milli):
        decision = place(state, pod, chosen, run.ctx)
        if isinstance(decision, Placement):
            state.allocate(pod, decision.allocation)
    return state


def placed_shares(state: ClusterState) -> list[int]:
    return [g.milli for held in state.held.values() if len(held.allocation.grants) == 1
            for g in held.allocation.grants if g.milli < MILLI_PER_GPU]


def idle_breakdown(state: ClusterState) -> dict[str, float]:
    """Idle GPU compute by what shares the GPU it sits on, % of the cluster's GPUs per class."""
    capacity = state.total_gpus * MILLI_PER_GPU
    on_gpu: dict[tuple[int, int], list[int]] = {}
    for held in state.held.values():
        for g in held.allocation.grants:
            on_gpu.setdefault((held.node_index, g.index), []).append(g.milli)
    classes: dict[str, float] = {}
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
    ap.add_argument("--breakdown", default="fgd,gpupool", help="policies replayed against the bounds")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    policies = [p for p in a.breakdown.split(",") if p]
    nodes = load_nodes(TRACE_DIR / NODES_FILE)
    capacity = ClusterState(nodes).total_gpus * MILLI_PER_GPU
    pct = 100.0 / capacity
    print(f"cores: {os.cpu_count()}; seeds: {seeds}; capacity: {capacity // MILLI_PER_GPU} GPUs")
    summary: dict[str, dict[str, float]] = {}
    for trace in a.traces.split(","):
        pods = load_pods(resolve_trace(trace))
        print(f"\n{trace}: unallocated GPU % at arrived = 100 % (bounds; policies: idle / least slack of its shares)")
        print(f"{'seed':>4} {'arrived%':>8} " + " ".join(f"{b:>10}" for b in BOUNDS) + " (at arrived%)"
              + "".join(f" {p:>15}" for p in policies))
        measured = [f"{p} {m}" for p in policies for m in ("idle", "repack")]
        rows: dict[str, list[float]] = {k: [] for k in (*BOUNDS, *measured)}
        for seed in seeds:
            submitted = setup(nodes, pods, seed).submitted
            shares, arrived = arrived_shares(submitted, capacity)
            filled, at = filled_until(submitted, capacity)
            values = {"estimate": fractional_slack(shares), "any policy": least_unallocated(shares).milli,
                      "all placed": least_slack(shares).milli, "filled": filled.milli}
            line = f"{seed:>4} {arrived:8.2f} " + " ".join(f"{pct * values[b]:10.2f}" for b in BOUNDS) + f" ({at:.1f})"
            for b in BOUNDS:
                rows[b].append(pct * values[b])
            for policy in policies:
                state = replay_until_full(nodes, pods, policy, seed)
                idle = pct * (capacity - state.allocated_milli())
                repack = pct * least_slack(placed_shares(state)).milli
                rows[f"{policy} idle"].append(idle)
                rows[f"{policy} repack"].append(repack)
                line += f" {idle:7.2f} /{repack:6.2f}"
                if seed == seeds[0]:
                    where = sorted(idle_breakdown(state).items(), key=lambda kv: -kv[1])[:6]
                    print(f"  {policy}, seed {seed}: idle {idle:.2f} % of GPUs, by where it sits: "
                          + ", ".join(f"{key} {value:.2f}" for key, value in where))
            print(line, flush=True)
        summary[trace] = {k: round(statistics.fmean(v), 3) for k, v in rows.items()}
        print("mean " + " ".join(f"{k} {v:.2f}" for k, v in summary[trace].items()))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
