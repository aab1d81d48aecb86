"""End-to-end scheduling decisions per second in `gpupool demo`: the embedded cluster, the extender over
real HTTP on 127.0.0.1, and the fake kube-scheduler (filter -> prioritize -> bind) in one process.

Usage: python benchmarks/demo_throughput.py --nodes 1000 [--pods 2000] [--runs 3]
Last line: {"nodes": N, "pods_per_s": x}  (median over runs; every run starts from an empty cluster)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import time

from gpupool.demo.embedded import load_scenario, start_embedded, workload_pods
from gpupool.demo.kube_scheduler import KubeSchedulerDriver


async def one_run(nodes: int, pods: int) -> tuple[float, int, int]:
    scenario = load_scenario().scaled(nodes)
    emb = await start_embedded(scenario)
    driver = KubeSchedulerDriver(emb.url, emb.cluster, emb.node_names, seed=scenario.seed)
    workload = workload_pods(scenario, pods)
    try:
        start = time.perf_counter()
        stats = await driver.run(workload)
        elapsed = time.perf_counter() - start
    finally:
        await driver.close()
        await emb.stop()
    return len(workload) / elapsed, stats.bound, stats.unschedulable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    print(f"cpu cores: {os.cpu_count()}; nodes={args.nodes} pods={args.pods} runs={args.runs}")
    rates = []
    for i in range(args.runs):
        rate, bound, unschedulable = asyncio.run(one_run(args.nodes, args.pods))
        rates.append(rate)
        print(f"run {i + 1}: {rate:.1f} pods/s (bound {bound}, unschedulable {unschedulable})")
    print(json.dumps({"nodes": args.nodes, "pods_per_s": round(statistics.median(rates), 1)}))


if __name__ == "__main__":
    main()
