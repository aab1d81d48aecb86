"""Unallocated GPU % with and without moves (issue 39 item 2): `gpupool simulate --moves N` on the default trace.

Per policy and seed, the static FGD replay without moves and with at most N moves per pod (N = 1, 2, 4 by
default): a pod that fits nowhere is placed after the cheapest plan of at most N moves of movable shares
(gpupool.core.moves; every placed one-GPU share below a whole GPU is movable unless --movable says less).
Prints a table (median and mean over seeds of unallocated % at arrived = 100 %, moves and GiB moved until
then, seconds per replay), whether any configuration goes below 3.58 % (the proven floor for policies that
never move, docs/placement.md), and a last line of one JSON object.
Usage: python benchmarks/simulate_moves.py [--seeds 42,43,44] [--num-seeds 10] [--policies gpupool,fgd]
       [--moves 1,2,4] [--movable 1.0] [--cost-per-gib 1.0] [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from gpupool.sim.parallel import Job, available_cores, run_all
from gpupool.sim.replay import ReplayLog, replay
from gpupool.sim.trace import NODES_FILE, TRACE_DIR, load_nodes, load_pods, resolve_trace

FLOOR = 3.58  # benchmarks/unallocated_bound.py, "filled": policies that never move, default trace


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default: --num-seeds from 42)")
    ap.add_argument("--num-seeds", type=int, default=10)
    ap.add_argument("--policies", default="gpupool,fgd")
    ap.add_argument("--moves", default="1,2,4")
    ap.add_argument("--movable", type=float, default=1.0)
    ap.add_argument("--cost-per-gib", type=float, default=1.0)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--trace", default="default")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")] if a.seeds else list(range(42, 42 + a.num_seeds))
    policies = [p for p in a.policies.split(",") if p]
    limits = [0] + [int(n) for n in a.moves.split(",") if n]
    workers = a.jobs or available_cores()
    nodes = load_nodes(TRACE_DIR / NODES_FILE)
    pods = load_pods(resolve_trace(a.trace))
    print(f"cores: {os.cpu_count()} ({available_cores()} usable); jobs: {workers}; trace: {a.trace}; seeds: {seeds}; "
          f"movable: {a.movable:g} of the one-GPU shares; cost per GiB: {a.cost_per_gib:g}")
    jobs = [Job(p, s) for p in policies for s in seeds]
    logs: dict[tuple[str, int], list[ReplayLog]] = {}
    for n in limits:
        options = {"moves": n, "move_cost_per_gib": a.cost_per_gib, "movable": a.movable} if n else {}
        for job, log in zip(jobs, run_all(replay, nodes, pods, jobs, workers, **options), strict=True):
            logs.setdefault((job.policy, n), []).append(log)
    print("\nunallocated GPU % at arrived = 100 % (per seed; moves and GiB moved until then)")
    print(f"{'policy':<8} {'N':>2} {'median':>7} {'mean':>7} {'min':>6} {'max':>6} {'moves':>7} {'GiB':>8} "
          f"{'s/replay':>8}  per seed")
    summary: dict[str, dict[str, dict[str, float]]] = {}
    best = float("inf")
    for policy in policies:
        for n in limits:
            runs = logs[(policy, n)]
            pct = [100.0 - log.allocated_at(100) for log in runs]
            moved = [log.moves_until(100) for log in runs]
            row = {"median": round(statistics.median(pct), 3), "mean": round(statistics.fmean(pct), 3),
                   "moves": round(statistics.fmean(m for m, _ in moved), 1),
                   "gib_moved": round(statistics.fmean(g for _, g in moved), 1),
                   "seconds_per_replay": round(statistics.median(log.seconds for log in runs), 1)}
            summary.setdefault(policy, {})[str(n)] = row
            best = min(best, row["mean"])
            print(f"{policy:<8} {n:>2} {row['median']:7.2f} {row['mean']:7.2f} {min(pct):6.2f} {max(pct):6.2f} "
                  f"{row['moves']:7.1f} {row['gib_moved']:8.1f} {row['seconds_per_replay']:8.1f}  "
                  + " ".join(f"{x:.2f}" for x in pct))
    below = best < FLOOR
    print(f"\nbest mean {best:.2f} %: {'below' if below else 'not below'} the {FLOOR} % floor of policies that "
          "never move")
    print(json.dumps({"trace": a.trace, "seeds": seeds, "cores": os.cpu_count(), "movable": a.movable,
                      "cost_per_gib": a.cost_per_gib, "floor_pct": FLOOR, "below_floor": below,
                      "policies": summary}))


if __name__ == "__main__":
    main()
