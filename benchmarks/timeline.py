"""Timeline replay of the bundled `default` trace with its node list as bundled, policies bestfit, fgd and
gpupool: waits, pods that never ran, GPU allocation, and the nodes each policy needs for a wait target.

The figures are deterministic (seed 42 breaks score ties); only the seconds vary, so the timeline replay
is timed --runs times and the median is printed. The capacity search runs once per policy.
Last line: one JSON object {"trace", "cores", "policies": {name: {...}}, "capacity": {...}}.
Usage: python benchmarks/timeline.py [--target 5m] [--runs 3] [--jobs N]

With --queues N: team queues instead (gpupool.sim.team_queues), on the node list scaled to --scale nodes (default
8: the trace's peak demand then meets contention; on the bundled 1,213 nodes nobody ever waits), N queues each
guaranteed 1/N of the GPUs, pods by a hash of their name: FIFO + bestfit, FIFO + fgd, FIFO + gpupool and fair +
gpupool side by side: GPU allocation, wait p99 per queue, preemptions and GPU-hours lost to them. Last line:
one JSON object with a `queues` section.
"""

from __future__ import annotations

import argparse
import json
import statistics

from gpupool.commands.sim_timeline import parse_duration
from gpupool.sim.capacity import PRECISION, timeline_job
from gpupool.sim.parallel import Job, available_cores, run_all
from gpupool.sim.timeline import timed_pods
from gpupool.sim.timeline_report import summarise_timeline
from gpupool.sim.trace import NODES_FILE, TRACE_DIR, load_nodes, load_pods, load_times, resolve_trace

POLICIES = ["bestfit", "fgd", "gpupool"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="5m", help="wait p99 target of the capacity search (default 5m)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=available_cores())
    ap.add_argument("--queues", type=int, default=None, help="replay with N team queues instead (see above)")
    ap.add_argument("--scale", type=int, default=8, help="with --queues: nodes in the scaled node list")
    args = ap.parse_args()
    if args.queues is not None:
        queues_benchmark(args.queues, args.scale, args.jobs)
        return
    target = parse_duration(args.target)
    path = resolve_trace("default")
    nodes = load_nodes(TRACE_DIR / NODES_FILE)
    pods = timed_pods(load_pods(path), load_times(path))
    print(f"cores: {available_cores()} usable, {args.jobs} worker process(es); {len(pods):,} pods, "
          f"{len(nodes):,} nodes")
    seconds: dict[str, list[float]] = {p: [] for p in POLICIES}
    summary = {}
    for _ in range(args.runs):
        results = run_all(timeline_job, nodes, pods, [Job(p, 42) for p in POLICIES], args.jobs)
        for p, r in zip(POLICIES, results, strict=True):
            seconds[p].append(r.log.seconds)
            summary[p] = summarise_timeline(r.log)
    capacity = run_all(timeline_job, nodes, pods, [Job(p, 42) for p in POLICIES], args.jobs, target_s=target)
    figures = {}
    for p, r in zip(POLICIES, capacity, strict=True):
        s = summary[p]
        a = r.capacity
        assert a is not None
        figures[p] = {"wait_p50_s": s["wait_p50_s"], "wait_p95_s": s["wait_p95_s"], "wait_p99_s": s["wait_p99_s"],
                      "never_ran": s["never_ran"], "gpu_alloc_mean": s["gpu_alloc_mean"],
                      "gpu_alloc_p10": s["gpu_alloc_p10"], "gpu_alloc_mean_pct": s["gpu_alloc_mean_pct"],
                      "frag_mean_pct": s["frag_mean_pct"],
                      "replay_s_median": round(statistics.median(seconds[p]), 2)}
        print(f"{p:8s} wait p50/p95/p99 {s['wait_p50_s']:.0f}/{s['wait_p95_s']:.0f}/{s['wait_p99_s']:.0f} s, "
              f"never ran {s['never_ran']}, GPUs allocated mean {s['gpu_alloc_mean']:.1f} "
              f"({s['gpu_alloc_mean_pct']:.2f} %), p10 {s['gpu_alloc_p10']:.1f}, frag mean {s['frag_mean_pct']:.2f} %, "
              f"replay {statistics.median(seconds[p]):.2f} s (median of {args.runs}); "
              f"needs {a.nodes} nodes / {a.gpus} GPUs for wait p99 <= {target:.0f} s "
              f"(sizes tried: {dict(sorted(a.tried.items()))})")
    cap = {"target_wait_p99_s": target, "precision": PRECISION}
    for p, r in zip(POLICIES, capacity, strict=True):
        assert r.capacity is not None
        cap[f"{p}_nodes"] = r.capacity.nodes
        cap[f"{p}_gpus"] = r.capacity.gpus
    print(json.dumps({"trace": "default", "cores": available_cores(), "policies": figures, "capacity": cap}))


def queues_benchmark(count: int, scale: int, jobs: int) -> None:
    from gpupool.sim.capacity import scaled_nodes
    from gpupool.sim.team_queues import even_queues

    path = resolve_trace("default")
    nodes = scaled_nodes(load_nodes(TRACE_DIR / NODES_FILE), scale)
    pods = timed_pods(load_pods(path), load_times(path))
    queues = even_queues(count, nodes)
    print(f"cores: {available_cores()} usable, {jobs} worker process(es); {len(pods):,} pods, {len(nodes)} nodes "
          f"({sum(len(n.gpus) for n in nodes)} GPUs), {count} queues each guaranteed 1/{count} of the GPUs")
    variants = [("bestfit", "fifo"), ("fgd", "fifo"), ("gpupool", "fifo"), ("gpupool", "fair")]
    out: dict[str, dict[str, object]] = {}
    for order in ("fifo", "fair"):
        names = [p for p, o in variants if o == order]
        results = run_all(timeline_job, nodes, pods, [Job(p, 42) for p in names], jobs, queues=queues, order=order)
        for name, r in zip(names, results, strict=True):
            s = summarise_timeline(r.log)
            assert r.queues is not None
            per = {q: {"wait_p99_s": f["wait_p99_s"], "never_ran": f["never_ran"],
                       "gpu_hours_served": f["gpu_hours_served"], "preemptions": f["preemptions"]}
                   for q, f in r.queues.items() if not q.startswith("_")}
            key = f"{order}+{name}"
            out[key] = {"gpu_alloc_mean_pct": s["gpu_alloc_mean_pct"], "wait_p99_s": s["wait_p99_s"],
                        "preemptions": sum(int(f["preemptions"]) for f in per.values()),
                        "lost_gpu_hours": r.queues["_lost_gpu_hours"], "queues": per}
            waits = ", ".join(f"{q} {f['wait_p99_s']:.0f} s" for q, f in per.items())
            print(f"{key:14s} GPUs allocated {s['gpu_alloc_mean_pct']:.2f} %, wait p99 {s['wait_p99_s']:.0f} s; "
                  f"per queue p99: {waits}; preemptions {out[key]['preemptions']}, "
                  f"GPU-h lost {r.queues['_lost_gpu_hours']}; replay {r.log.seconds:.1f} s")
    print(json.dumps({"trace": "default", "cores": available_cores(), "nodes": len(nodes),
                      "queues": {"count": count, "variants": out}}))


if __name__ == "__main__":
    main()
