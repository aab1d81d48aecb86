"""`gpupool` against FGD on model-constrained variants of the `default` trace (gpupool.sim.constrain,
variant seed 0): unallocated GPU % at arrived demand = 100 % per replay seed, for each fraction of GPU
pods naming models. Last line: one JSON object {fraction: {policy: {seed: unallocated %}}}.
Usage: python benchmarks/simulate_constrained.py [--fractions 0.1,0.2,0.33] [--seeds 42,...] [--jobs N]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from gpupool.sim.constrain import constrain_models
from gpupool.sim.parallel import Job, available_cores, run_all
from gpupool.sim.replay import replay
from gpupool.sim.trace import NODES_FILE, TRACE_DIR, load_nodes, load_pods, resolve_trace

POLICIES = ["fgd", "gpupool"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fractions", default="0.1,0.2,0.33")
    ap.add_argument("--seeds", default=",".join(str(s) for s in range(42, 52)))
    ap.add_argument("--trace", default="default")
    ap.add_argument("--jobs", type=int, default=available_cores())
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    nodes = load_nodes(TRACE_DIR / NODES_FILE)
    base = load_pods(resolve_trace(args.trace))
    print(f"cores: {available_cores()}; trace {args.trace}; seeds {seeds[0]}-{seeds[-1]}")
    doc: dict[str, dict[str, dict[int, float]]] = {}
    for fraction in (float(f) for f in args.fractions.split(",")):
        pods = constrain_models(base, nodes, fraction)
        jobs = [Job(p, s) for p in POLICIES for s in seeds]
        logs = run_all(replay, nodes, pods, jobs, args.jobs)
        table: dict[str, dict[int, float]] = {p: {} for p in POLICIES}
        for job, log in zip(jobs, logs, strict=True):
            table[job.policy][job.seed] = round(100.0 - log.allocated_at(100), 3)
        doc[f"{fraction:g}"] = table
        print(f"\n{fraction:.0%} of GPU pods constrained: unallocated % at 100 % arrived")
        print("seed    " + "  ".join(f"{s:>6d}" for s in seeds) + "    mean    std")
        for p in POLICIES:
            v = [table[p][s] for s in seeds]
            print(f"{p:8s}" + "  ".join(f"{x:6.2f}" for x in v) + f"  {np.mean(v):6.2f} {np.std(v):6.2f}")
        worse = [s for s in seeds if table["gpupool"][s] > table["fgd"][s]]
        print(f"gpupool worse than fgd on seeds: {worse or 'none'}")
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
