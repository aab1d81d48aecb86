"""Unallocated GPU % with and without moves (issue 39 item 2): `gpupool simulate --moves N` and the background
defragmenter on the default trace.

Per policy and seed, the static FGD replay without moves, with at most N moves per pod (N = 1, 2, 4 by
default: a pod that fits nowhere is placed after the cheapest plan of at most N moves of movable shares,
gpupool.core.moves), and with the background defragmenter (gpupool.core.defrag: every INTERVAL pods, when the
fragmentation is above THRESHOLD, a round of at most MOVES moves that empties GPUs into fuller ones; rows
`D<k>`, alone and with --defrag-with-moves N on top). Every placed one-GPU share below a whole GPU is movable
unless --movable says less. Prints a table (median and mean over seeds of unallocated % at arrived = 100 %,
moves and GiB moved until then, seconds per replay), whether any configuration's median goes below 3.58 % (the
proven floor for policies that never move, docs/placement.md), and a last line of one JSON object:
`unallocated_pct_no_moves`, `unallocated_pct_moves` (the best N), `unallocated_pct_defrag` (the best
defragmenter row), their `moves` and `gib_moved` (per seed, until arrived = 100 %), `below_floor`, and every
row under `policies` (`why`: below). The summary keys are for the first policy of --policies. Then, for the
first policy without moves on the first --why-seeds seeds, why moves cannot help once the cluster is full:
where its free compute sits at arrived = 100 %, the holes, and whether any plan of 1-8 moves or a
defragmentation round frees a GPU then.
Usage: python benchmarks/simulate_moves.py [--seeds 42,43,44] [--num-seeds 10] [--policies gpupool,fgd]
       [--moves 1,2,4] [--defrag 50:0.5:16,25:0:32] [--defrag-with-moves 4] [--movable 1.0]
       [--cost-per-gib 1.0] [--jobs N] [--why-seeds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

from gpupool.core.defrag import plan_defrag
from gpupool.core.model import MILLI_PER_GPU, GPURequest, Node, PodRequest
from gpupool.core.moves import MovableShares, plan_moves
from gpupool.core.policies import get_policy
from gpupool.sim.engine import Placer
from gpupool.sim.parallel import Job, available_cores, run_all
from gpupool.sim.replay import DefragPolicy, ReplayLog, replay, setup
from gpupool.sim.trace import NODES_FILE, TRACE_DIR, load_nodes, load_pods, resolve_trace

FLOOR = 3.58  # benchmarks/unallocated_bound.py, "filled": policies that never move, default trace


def parse_defrag(text: str) -> list[DefragPolicy]:
    """`INTERVAL:THRESHOLD:MOVES[:GIB]`, comma-separated; exits 2 naming the bad entry."""
    out = []
    for entry in (e for e in text.split(",") if e):
        parts = entry.split(":")
        try:
            if len(parts) not in (3, 4):
                raise ValueError("expected INTERVAL:THRESHOLD:MOVES[:GIB]")
            out.append(DefragPolicy(int(parts[0]), float(parts[1]), int(parts[2]),
                                    float(parts[3]) if len(parts) == 4 else None))
        except ValueError as e:
            print(f"--defrag {entry!r}: {e}", file=sys.stderr)
            raise SystemExit(2) from None
    return out


def where_unallocated(nodes: list[Node], pods: list[PodRequest], policy: str, seed: int) -> dict[str, float]:
    """Why moves cannot help at the end, on the policy's state (no moves) when arrived demand reaches capacity:
    where the free compute sits (% of the cluster's GPUs), how many holes could take a share above 0.19 of a
    GPU, and whether any plan of at most 1-8 moves frees a GPU for a whole-GPU pod, or a defragmentation round
    (64 moves) empties any."""
    run = setup(nodes, pods, seed)
    state, placer = run.state, Placer(run.state, get_policy(policy), run.ctx)
    movable = MovableShares(state)
    arrived = 0
    for pod in run.submitted:
        if arrived + pod.gpu.total_milli > run.capacity_milli:
            break
        arrived += pod.gpu.total_milli
        choice = placer.decide(pod)
        if choice is not None:
            placer.take(pod, choice)
            if pod.gpu.count == 1 and pod.gpu.milli < MILLI_PER_GPU:
                movable.add(pod.key, pod)
    pct = 100.0 / run.capacity_milli
    largest: dict[tuple[int, int], int] = {}
    for held in state.held.values():
        for g in held.allocation.grants:
            at = (held.node_index, g.index)
            largest[at] = max(largest.get(at, 0), g.milli)
    where = {"next to a 0.81 share": 0.0, "next to a 0.5-0.8 share": 0.0, "only shares <= 0.5": 0.0,
             "idle GPUs": 0.0}
    for (i, j), big in largest.items():
        free = int(state.gpu_milli_free[i, j])
        key = "next to a 0.81 share" if big == 810 else "next to a 0.5-0.8 share" if big > 500 else \
            "only shares <= 0.5"
        where[key] += pct * free
    free_gpus = state.gpu_present & (state.gpu_sharers == 0)
    where["idle GPUs"] = pct * float(state.gpu_milli_free[free_gpus].sum())
    holes = state.gpu_milli_free[state.gpu_present & (state.gpu_sharers > 0)]
    whole = PodRequest("whole-gpu", 1000, 1000, GPURequest(1, MILLI_PER_GPU))
    plans = {n: plan_moves(state, whole, movable, n, rank=run.ctx.rank) is not None for n in (1, 2, 4, 8)}
    out = {f"free {k} %": round(v, 2) for k, v in where.items()}
    out.update({"unallocated %": round(pct * float(state.gpu_milli_free[state.gpu_present].sum()), 2),
                "largest hole (milli)": int(holes.max(initial=0)),
                "holes of 0.20 or more": int(((holes >= 200) & (holes < MILLI_PER_GPU)).sum()),
                "shares of 0.19 or less placed (% of GPUs)": round(
                    pct * sum(h.allocation.grants[0].milli for h in state.held.values()
                              if len(h.allocation.grants) == 1 and h.allocation.grants[0].milli <= 190), 2),
                "0.81 shares alone on a GPU": sum(1 for at, big in largest.items() if big == 810
                                                 and int(state.gpu_milli_free[at]) == 190),
                "GPUs a defragmentation round (64 moves) empties": len(
                    plan_defrag(state, movable, 64, rank=run.ctx.rank).freed)})
    out.update({f"a whole-GPU pod placeable after at most {n} moves": ok for n, ok in plans.items()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default: --num-seeds from 42)")
    ap.add_argument("--num-seeds", type=int, default=10)
    ap.add_argument("--policies", default="gpupool,fgd")
    ap.add_argument("--moves", default="1,2,4")
    ap.add_argument("--defrag", default="50:0.5:16,25:0:32",
                    help="defragmenter settings INTERVAL:THRESHOLD:MOVES[:GIB], comma-separated ('' for none)")
    ap.add_argument("--defrag-with-moves", type=int, default=4,
                    help="also run each defragmenter setting with at most this many moves per pod (0: not)")
    ap.add_argument("--movable", type=float, default=1.0)
    ap.add_argument("--cost-per-gib", type=float, default=1.0)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--trace", default="default")
    ap.add_argument("--why-seeds", type=int, default=3,
                    help="print where the unallocated compute sits for the first policy on this many seeds (0: not)")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")] if a.seeds else list(range(42, 42 + a.num_seeds))
    policies = [p for p in a.policies.split(",") if p]
    defrags = parse_defrag(a.defrag)
    # Row name -> replay options.
    rows: dict[str, dict[str, Any]] = {"0": {}}
    for n in (int(x) for x in a.moves.split(",") if x):
        rows[str(n)] = {"moves": n, "move_cost_per_gib": a.cost_per_gib, "movable": a.movable}
    for k, d in enumerate(defrags, 1):
        rows[f"D{k}"] = {"defrag": d, "movable": a.movable, "move_cost_per_gib": a.cost_per_gib}
        if a.defrag_with_moves:
            rows[f"D{k}+{a.defrag_with_moves}"] = {**rows[f"D{k}"], "moves": a.defrag_with_moves}
    workers = a.jobs or available_cores()
    nodes = load_nodes(TRACE_DIR / NODES_FILE)
    pods = load_pods(resolve_trace(a.trace))
    print(f"cores: {os.cpu_count()} ({available_cores()} usable); jobs: {workers}; trace: {a.trace}; seeds: {seeds}; "
          f"movable: {a.movable:g} of the one-GPU shares; cost per GiB: {a.cost_per_gib:g}")
    for k, d in enumerate(defrags, 1):
        print(f"D{k}: defragmenter every {d.interval} pods above fragmentation {d.threshold:g}, at most "
              f"{d.max_moves} moves{'' if d.max_gib is None else f' and {d.max_gib:g} GiB'} a round")
    jobs = [Job(p, s) for p in policies for s in seeds]
    logs: dict[tuple[str, str], list[ReplayLog]] = {}
    for name, options in rows.items():
        for job, log in zip(jobs, run_all(replay, nodes, pods, jobs, workers, **options), strict=True):
            logs.setdefault((job.policy, name), []).append(log)
    print("\nunallocated GPU % at arrived = 100 % (per seed; moves and GiB moved until then, per seed)")
    print(f"{'policy':<8} {'row':>6} {'median':>7} {'mean':>7} {'min':>6} {'max':>6} {'moves':>7} {'GiB':>8} "
          f"{'s/replay':>8}  per seed")
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for policy in policies:
        for name in rows:
            runs = logs[(policy, name)]
            pct = [100.0 - log.allocated_at(100) for log in runs]
            moved = [log.moves_until(100) for log in runs]
            row = {"median": round(statistics.median(pct), 3), "mean": round(statistics.fmean(pct), 3),
                   "moves": round(statistics.fmean(m for m, _ in moved), 1),
                   "gib_moved": round(statistics.fmean(g for _, g in moved), 1),
                   "seconds_per_replay": round(statistics.median(log.seconds for log in runs), 1)}
            summary.setdefault(policy, {})[name] = row
            print(f"{policy:<8} {name:>6} {row['median']:7.2f} {row['mean']:7.2f} {min(pct):6.2f} {max(pct):6.2f} "
                  f"{row['moves']:7.1f} {row['gib_moved']:8.1f} {row['seconds_per_replay']:8.1f}  "
                  + " ".join(f"{x:.2f}" for x in pct))
    why = {s: where_unallocated(nodes, pods, policies[0], s) for s in seeds[: a.why_seeds]}
    if why:
        print(f"\nwhy, {policies[0]} without moves at arrived = 100 % (per seed: {', '.join(map(str, why))})")
        for key in next(iter(why.values())):
            print(f"  {key}: " + ", ".join(str(w[key]) for w in why.values()))
    mine = summary[policies[0]]
    moved_rows = [r for n, r in mine.items() if n != "0" and not n.startswith("D")]
    defrag_rows = [r for n, r in mine.items() if n.startswith("D")]
    best_moves = min(moved_rows, key=lambda r: r["median"], default=mine["0"])
    best_defrag = min(defrag_rows, key=lambda r: r["median"], default=mine["0"])
    best = min(r["median"] for rows_of in summary.values() for r in rows_of.values())
    below = best < FLOOR
    print(f"\nbest median {best:.2f} %: {'below' if below else 'not below'} the {FLOOR} % floor of policies that "
          "never move")
    print(json.dumps({"trace": a.trace, "seeds": seeds, "cores": os.cpu_count(), "movable": a.movable,
                      "cost_per_gib": a.cost_per_gib, "floor_pct": FLOOR, "policy": policies[0],
                      "unallocated_pct_no_moves": mine["0"]["median"],
                      "unallocated_pct_moves": best_moves["median"],
                      "unallocated_pct_defrag": best_defrag["median"],
                      "moves": {"moves": best_moves["moves"], "defrag": best_defrag["moves"]},
                      "gib_moved": {"moves": best_moves["gib_moved"], "defrag": best_defrag["gib_moved"]},
                      "below_floor": below, "policies": summary, "why": why}))


if __name__ == "__main__":
    main()
