"""Fidelity, quality and speed of the placement engine on the bundled Alibaba GPU trace v2023.

Runs seeds 42-51 (or --seeds) of every policy on the three bundled traces, prints unallocated GPU % at
arrived demand = 100 % (mean ± std) beside the published FGD-artifact numbers, the seconds per seed, and
as its last line one JSON object: trace -> policy -> unallocated % at 100.
Usage: python benchmarks/simulate_fidelity.py [--seeds 42,43] [--traces default] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from concurrent.futures import ProcessPoolExecutor

PUBLISHED = {  # trace-evaluation.md §3.7, mean of seeds 42-51
    "default": {"random": 13.70, "dotprod": 9.38, "clustering": 8.35, "packing": 8.22, "bestfit": 7.14,
                "fgd": 4.77},
    "gpushare100": {"random": 21.10, "dotprod": 18.02, "clustering": 17.78, "packing": 17.87,
                    "bestfit": 15.38, "fgd": 13.36},
    "multigpu50": {"random": 18.72, "dotprod": 5.27, "clustering": 4.31, "packing": 3.94, "bestfit": 4.38,
                   "fgd": 2.91},
}
POLICIES = ["random", "dotprod", "clustering", "packing", "bestfit", "fgd", "gpupool"]


def one(args: tuple[str, str, int]) -> tuple[str, str, int, float, float, float]:
    from gpupool.sim.replay import replay
    from gpupool.sim.trace import NODES_FILE, TRACE_DIR, load_nodes, load_pods, resolve_trace

    trace, policy, seed = args
    log = replay(load_nodes(TRACE_DIR / NODES_FILE), load_pods(resolve_trace(trace)), policy, seed)
    return trace, policy, seed, 100.0 - log.allocated_at(100), 100.0 - log.allocated_at(130), log.seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default=",".join(str(s) for s in range(42, 52)))
    ap.add_argument("--traces", default="default,gpushare100,multigpu50")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    traces = a.traces.split(",")
    policies = a.policies.split(",")
    print(f"cores: {os.cpu_count()}; jobs: {a.jobs}; seeds: {seeds}")
    tasks = [(t, p, s) for t in traces for p in policies for s in seeds]
    results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        for trace, policy, _seed, u100, u130, secs in pool.map(one, tasks):
            results.setdefault((trace, policy), []).append((u100, u130, secs))
    summary: dict[str, dict[str, float]] = {}
    for trace in traces:
        print(f"\n{trace}: unallocated GPU % at arrived = 100 % (mean ± std over {len(seeds)} seeds)")
        print(f"{'policy':<11} {'ours':>7} {'± std':>6} {'paper':>6} {'diff':>6} {'@130':>6} {'s/seed':>7}")
        for policy in policies:
            rows = results[(trace, policy)]
            u100 = [r[0] for r in rows]
            mean = statistics.fmean(u100)
            std = statistics.pstdev(u100)
            secs = statistics.median(r[2] for r in rows)
            paper = PUBLISHED.get(trace, {}).get(policy)
            diff = f"{mean - paper:+.2f}" if paper is not None else "-"
            paper_s = f"{paper:.2f}" if paper is not None else "-"
            print(f"{policy:<11} {mean:7.2f} {std:6.2f} {paper_s:>6} {diff:>6} "
                  f"{statistics.fmean(r[1] for r in rows):6.2f} {secs:7.1f}")
            summary.setdefault(trace, {})[policy] = round(mean, 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
