"""One pool of every vendor's cards against per-vendor islands (issue 40 item 5): `gpupool simulate --vendor-mix`
on the default trace.

By default 30 % of the trace's GPU nodes become AMD MI300X nodes and 10 % Ascend 910B nodes (the catalogue's
memory and compute units, each node keeping its number of GPUs), and each GPU pod's runtime is drawn with the
same shares (gpupool.sim.vendor_mix, seeded; --mix ...,any=0.3 adds pods that run anywhere). Every GPU pod is
held in isolation hook, the cluster's default: its share may only go to cards whose vendor holds hook shares
(NVIDIA, AMD), and a share drawn cann asks for the whole card (Ascend cards hold no share). Per replay seed,
the static FGD replay of one policy on one pool (every pod placed only on cards of its runtime, core.fit's
routing) and on the islands (the same pods in the same order, each placed in its vendor's cluster alone);
unallocated GPU % at arrived demand = 100 % of the whole capacity for each. Misrouted: pods either replay
placed on a card whose vendor does not run their runtime, or a share on a card whose vendor does not hold its
isolation mode (an "any" share on an Ascend card), counted from the final placement, not by placement's own
rule (goal 0).
Prints the machine's cores, a line per seed, the medians, and as its last line one JSON object.
Usage: python benchmarks/vendors.py [--mix amd=0.3,ascend=0.1] [--num-seeds 3] [--seeds 42,43]
       [--policy gpupool] [--jobs N] [--trace default] [--nodes NODES.csv]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpupool.core.model import Node, PodRequest
from gpupool.core.policies import REGISTRY
from gpupool.sim.parallel import Job, available_cores, run_all
from gpupool.sim.replay import ReplayLog
from gpupool.sim.trace import NODES_FILE, TRACE_DIR, TraceError, load_nodes, load_pods, resolve_trace
from gpupool.sim.vendor_mix import VendorMixError, compare, node_counts, parse_mix

RESULT_KEYS = ("vendors", "pods", "misrouted", "unallocated_pct_one_pool", "unallocated_pct_islands")


def result(report: dict[str, Any], policy: str, seeds: Sequence[int], cores: int | None) -> dict[str, Any]:
    """The last line: the issue's keys (medians over seeds), then what they were measured on."""
    r = report["policies"][policy]
    return {
        "vendors": report["vendors"],
        "pods": report["pods"],
        "misrouted": r["misrouted"],
        "unallocated_pct_one_pool": round(statistics.median(r["one_pool_per_seed"]), 3),
        "unallocated_pct_islands": round(statistics.median(r["islands_per_seed"]), 3),
        "one_pool_per_seed": r["one_pool_per_seed"],
        "islands_per_seed": r["islands_per_seed"],
        "unallocated_pct_per_island": r["unallocated_pct_per_island"],
        "mix": report["mix"],
        "mix_seed": report["mix_seed"],
        "policy": policy,
        "seeds": list(seeds),
        "cores": cores,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--mix", default="amd=0.3,ascend=0.1", help="vendor mix (gpupool simulate --vendor-mix)")
    ap.add_argument("--seeds", default=None, help="comma-separated replay seeds (default: --num-seeds from 42)")
    ap.add_argument("--num-seeds", type=int, default=3)
    ap.add_argument("--policy", default="gpupool")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--trace", default="default")
    ap.add_argument("--nodes", default=None, help="node CSV (default: the trace's 1,213 GPU nodes)")
    a = ap.parse_args()
    try:
        mix = parse_mix(a.mix)
        seeds = [int(s) for s in a.seeds.split(",") if s.strip()] if a.seeds else list(range(42, 42 + a.num_seeds))
    except (VendorMixError, ValueError) as e:
        ap.error(f"--mix/--seeds: {e}")
    if not seeds or a.num_seeds < 1:
        ap.error("at least one seed")
    if a.policy not in REGISTRY:
        ap.error(f"--policy {a.policy}: unknown (use one of {', '.join(sorted(REGISTRY))})")
    try:
        nodes = load_nodes(Path(a.nodes) if a.nodes else TRACE_DIR / NODES_FILE)
        pods = load_pods(resolve_trace(a.trace))
        node_counts(mix, sum(1 for n in nodes if n.gpus))
    except (TraceError, VendorMixError) as e:
        ap.error(str(e))
    workers = a.jobs or available_cores()
    print(f"cores: {os.cpu_count()} ({available_cores()} usable); jobs: {workers}; trace: {a.trace}; "
          f"mix: {mix.text()}; policy: {a.policy}; seeds: {seeds}")

    def run(fn: Callable[..., ReplayLog], mixed_nodes: Sequence[Node], mixed_pods: Sequence[PodRequest],
            jobs: Sequence[Job], **options: Any) -> list[ReplayLog]:
        return list(run_all(fn, mixed_nodes, mixed_pods, jobs, workers, **options))

    report = compare(nodes, pods, mix, [a.policy], seeds, run)
    for vendor, d in report["vendors"].items():
        print(f"{vendor:<7} {d['nodes']:>5} nodes {d['gpus']:>6} GPUs {d['pods']:>6} pods  {', '.join(d['models'])}")
    r = report["policies"][a.policy]
    print("\nunallocated GPU % at arrived = 100 %")
    print(f"{'seed':>6} {'one pool':>9} {'islands':>8}")
    for seed, one, apart in zip(seeds, r["one_pool_per_seed"], r["islands_per_seed"], strict=True):
        print(f"{seed:>6} {one:9.2f} {apart:8.2f}")
    line = result(report, a.policy, seeds, os.cpu_count())
    print(f"{'median':>6} {line['unallocated_pct_one_pool']:9.2f} {line['unallocated_pct_islands']:8.2f}   "
          f"misrouted: {line['misrouted']}")
    print(json.dumps(line))


if __name__ == "__main__":
    main()
