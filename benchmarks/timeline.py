"""Timeline replay of the bundled `default` trace with its node list as bundled, policies bestfit, fgd and
gpupool: waits, pods that never ran, GPU allocation, and the nodes each policy needs for a wait target.

The figures are deterministic (seed 42 breaks the timeline replay's score ties); only the seconds vary, so the
timeline replay is timed --runs times and the median is printed. A cluster size meets a target only when it
does on every seed of --seeds (default 42-51, as benchmarks/simulate_fidelity.py): its p99 wait is the longest
over those seeds' replays. The capacity search runs once per policy and target:
--targets (default 5m,30m,1h,2h,3h,4h; --target is added when missing) share one cache of measured sizes
per policy (`gpupool.sim.capacity.sweep_job`), so each size is replayed at most once per policy. Beside the
policies, per size and per target:

* `bound`: the least p99 wait any schedule can have (`gpupool.sim.wait_bound`: pooled capacity, any order,
  up to 1 % of pods left out); `bound_nodes` is the smallest size it does not rule out for the target
  (every smaller size checked), so the policies' searches start above it and never replay those sizes;
* `pooled FIFO`: the replay's own FIFO queue on pooled capacity (no node boundaries). Not a bound: it can
  wait longer than the policies (see the module);
* `leave out`: the pods the bound's witness leaves out (started at creation, the others then fit the
  pools) and each policy's p99 when exactly those pods are refused (what placement reaches once the queue
  stops admitting them), at the smallest size from `bound_nodes` of --target on where the witness leaves
  out at most 1 % of the pods, and at one node below fgd's answer.

Then the targets for which gpupool needs fewer nodes than fgd (and more), from the sizes measured.
Last line: one JSON object {"trace", "cores", "policies": {name: {...}}, "capacity": {...}, "sweep": {...},
"wall_s": {phase: seconds}}; waits that never end (more than 1 % of pods never ran) are null there.
Usage: python benchmarks/timeline.py [--target 5m] [--targets 5m,30m,1h,2h,3h,4h] [--seeds 42,43,...] [--runs 3]
       [--jobs N]

With --queues N: team queues instead (gpupool.sim.team_queues), on the node list scaled to --scale nodes (default
8: the trace's peak demand then meets contention; on the bundled 1,213 nodes nobody ever waits), N queues each
guaranteed 1/N of the GPUs, pods by a hash of their name: FIFO + bestfit, FIFO + fgd, FIFO + gpupool and fair +
gpupool side by side: GPU allocation, wait p99 per queue, preemptions and GPU-hours lost to them. Last line:
one JSON object with a `queues` section.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Sequence

from gpupool.commands.sim_timeline import parse_duration
from gpupool.core.model import Node
from gpupool.sim.capacity import (
    PRECISION,
    CapacityAnswer,
    fewer_nodes_targets,
    fewest_nodes_possible,
    p99_leaving_out,
    scaled_nodes,
    sweep_job,
    timeline_job,
)
from gpupool.sim.parallel import Job, available_cores, run_all
from gpupool.sim.timeline import timed_pods
from gpupool.sim.timeline_report import json_ready, summarise_timeline
from gpupool.sim.trace import NODES_FILE, TRACE_DIR, load_nodes, load_pods, load_times, resolve_trace
from gpupool.sim.wait_bound import (
    Pools,
    allowed_late,
    percentile_of_starts,
    pooled_fifo_starts,
    wait_lower_bound,
    witness,
)

POLICIES = ["bestfit", "fgd", "gpupool"]
DEFAULT_TARGETS = "5m,30m,1h,2h,3h,4h"


def seconds(x: float) -> str:
    return "never" if not math.isfinite(x) else f"{x:,.0f}"


def gpus(nodes: Sequence[Node], count: int | None) -> int | None:
    return None if count is None else sum(len(n.gpus) for n in scaled_nodes(nodes, count))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="5m", help="wait p99 target of the `capacity` section (default 5m)")
    ap.add_argument("--targets", default=DEFAULT_TARGETS,
                    help=f"comma-separated wait p99 targets of the sweep (default {DEFAULT_TARGETS})")
    ap.add_argument("--seeds", default=",".join(str(s) for s in range(42, 52)),
                    help="comma-separated; a size meets a target only on every one of these seeds (default 42-51)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=available_cores())
    ap.add_argument("--queues", type=int, default=None, help="replay with N team queues instead (see above)")
    ap.add_argument("--scale", type=int, default=8, help="with --queues: nodes in the scaled node list")
    args = ap.parse_args()
    if args.queues is not None:
        queues_benchmark(args.queues, args.scale, args.jobs)
        return
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    target = parse_duration(args.target)
    targets = sorted({parse_duration(t) for t in args.targets.split(",") if t.strip()} | {target})
    path = resolve_trace("default")
    nodes = load_nodes(TRACE_DIR / NODES_FILE)
    pods = timed_pods(load_pods(path), load_times(path))
    print(f"cores: {available_cores()} usable, {args.jobs} worker process(es); {len(pods):,} pods, "
          f"{len(nodes):,} nodes; capacity on every one of {len(seeds)} seeds: {', '.join(map(str, seeds))}")
    clock = {"start": time.perf_counter()}
    times: dict[str, list[float]] = {p: [] for p in POLICIES}
    summary = {}
    for _ in range(args.runs):
        results = run_all(timeline_job, nodes, pods, [Job(p, 42) for p in POLICIES], args.jobs)
        for p, r in zip(POLICIES, results, strict=True):
            times[p].append(r.log.seconds)
            summary[p] = summarise_timeline(r.log)
    clock["replays"] = time.perf_counter()
    # Per target the fewest nodes the bound allows: every smaller size fails for every policy, so the
    # searches start above it.
    pools: dict[int, Pools] = {}
    bound_nodes = [fewest_nodes_possible(nodes, pods, t, pools) for t in targets]
    floors = [(b or 1) - 1 for b in bound_nodes]
    swept: list[list[CapacityAnswer]] = run_all(sweep_job, nodes, pods, [Job(p, 42) for p in POLICIES], args.jobs,
                                                targets=targets, floors=floors, seeds=seeds)
    clock["sweep"] = time.perf_counter()
    answers = dict(zip(POLICIES, swept, strict=True))
    primary = {p: a[targets.index(target)] for p, a in answers.items()}
    figures = {}
    for p in POLICIES:
        s = summary[p]
        a = primary[p]
        figures[p] = {"wait_p50_s": s["wait_p50_s"], "wait_p95_s": s["wait_p95_s"], "wait_p99_s": s["wait_p99_s"],
                      "never_ran": s["never_ran"], "gpu_alloc_mean": s["gpu_alloc_mean"],
                      "gpu_alloc_p10": s["gpu_alloc_p10"], "gpu_alloc_mean_pct": s["gpu_alloc_mean_pct"],
                      "frag_mean_pct": s["frag_mean_pct"],
                      "replay_s_median": round(statistics.median(times[p]), 2)}
        print(f"{p:8s} wait p50/p95/p99 {s['wait_p50_s']:.0f}/{s['wait_p95_s']:.0f}/{s['wait_p99_s']:.0f} s, "
              f"never ran {s['never_ran']}, GPUs allocated mean {s['gpu_alloc_mean']:.1f} "
              f"({s['gpu_alloc_mean_pct']:.2f} %), p10 {s['gpu_alloc_p10']:.1f}, frag mean {s['frag_mean_pct']:.2f} %, "
              f"replay {statistics.median(times[p]):.2f} s (median of {args.runs}); "
              f"needs {a.nodes} nodes / {a.gpus} GPUs for wait p99 <= {target:.0f} s")

    # The bound and the pooled FIFO queue at every size a policy was replayed at or the bound ruled out.
    sizes = sorted({n for a in answers.values() for n in a[0].tried} | set(range(1, max(floors) + 1)))
    bound_cache: dict[int, float] = {}
    pooled: dict[int, float] = {}
    for n in sizes:
        scaled = scaled_nodes(nodes, n)
        bound_cache[n] = wait_lower_bound(scaled, pods)
        pooled[n] = percentile_of_starts(pods, pooled_fifo_starts(pools.get(n) or Pools.build(scaled, pods), pods))
    clock["bound"] = time.perf_counter()
    print(f"wait p99 (s) by node count (GPUs), the longest over the seeds, and how many of the seeds replayed "
          f"there meet {target:.0f} s (a seed whose wait never ends stops the rest); bound: least p99 of any "
          f"schedule (pooled capacity, any order, <= {allowed_late(len(pods), 99)} pods left out); pooled FIFO: this "
          "queue on pooled capacity, not a bound")
    print(f"{'nodes':>5s} {'GPUs':>4s} " + " ".join(f"{p:>15s}" for p in POLICIES)
          + f" {'bound':>9s} {'pooled FIFO':>11s}")

    def cell(p: str, n: int) -> str:
        w = answers[p][0].tried.get(n)
        if w is None:
            return "-"
        per = answers[p][0].by_seed.get(n, {})
        return f"{seconds(w)} {sum(v <= target for v in per.values())}/{len(per)}"

    for n in sizes:
        print(f"{n:5d} {gpus(nodes, n):4d} " + " ".join(f"{cell(p, n):>15s}" for p in POLICIES)
              + f" {seconds(bound_cache[n]):>9s} {seconds(pooled[n]):>11s}")
    sweep_rows = []
    print("nodes (GPUs) needed per wait p99 target:")
    for i, t in enumerate(targets):
        row: dict[str, float | int | None] = {"target_wait_p99_s": t}
        for p in POLICIES:
            row[f"{p}_nodes"], row[f"{p}_gpus"] = answers[p][i].nodes, answers[p][i].gpus
        row["bound_nodes"], row["bound_gpus"] = bound_nodes[i], gpus(nodes, bound_nodes[i])
        sweep_rows.append(row)
        print(f"  <= {t:>7,.0f} s: " + ", ".join(f"{p} {row[p + '_nodes']} ({row[p + '_gpus']})" for p in POLICIES)
              + f"; no schedule with fewer than {bound_nodes[i]} ({gpus(nodes, bound_nodes[i])})")

    # Refusing the pods the bound's witness leaves out: at the smallest size from the bound's on where the
    # witness needs no more than 1 % of the pods, and one node below fgd's answer.
    allowed = allowed_late(len(pods), 99)
    first = bound_nodes[targets.index(target)] or 1
    while len(witness(pools.get(first) or Pools.build(scaled_nodes(nodes, first), pods))) > allowed:
        first += 1
    leave_out = []
    for n in sorted({first, (primary["fgd"].nodes or 2) - 1}):
        scaled = scaled_nodes(nodes, n)
        out = witness(pools.get(n) or Pools.build(scaled, pods)).tolist()
        waits = run_all(p99_leaving_out, scaled, pods, [Job(p, 42) for p in POLICIES], args.jobs, leave_out=out)
        leave_out.append({"nodes": n, "gpus": gpus(nodes, n), "pods_left_out": len(out), "allowed": allowed,
                          "p99_s": dict(zip(POLICIES, waits, strict=True))})
        print(f"{n} nodes, refusing the {len(out)} pods the bound's witness leaves out "
              f"(<= {allowed} allowed): wait p99 "
              + ", ".join(f"{p} {seconds(w)} s" for p, w in zip(POLICIES, waits, strict=True)))
    clock["leave_out"] = time.perf_counter()
    phases = ["replays", "sweep", "bound", "leave_out"]  # the bound's floors are counted in the sweep
    spent = {k: round(clock[k] - clock[j], 1) for j, k in zip(["start", *phases[:-1]], phases, strict=True)}
    print("wall seconds: " + ", ".join(f"{k} {v}" for k, v in spent.items())
          + f", total {sum(spent.values()):.1f}")
    tables = {p: answers[p][0].tried for p in POLICIES}
    fewer = fewer_nodes_targets(tables["gpupool"], tables["fgd"])
    more = fewer_nodes_targets(tables["fgd"], tables["gpupool"])

    def spans(xs: list[tuple[float, float]]) -> str:
        return ", ".join(f"[{lo:,.0f}, {seconds(hi)}) s" for lo, hi in xs) or "none"

    print(f"wait p99 targets where gpupool needs fewer nodes than fgd: {spans(fewer)}; more: {spans(more)}")
    cap: dict[str, float | int | list[int] | None] = {"target_wait_p99_s": target, "precision": PRECISION,
                                                      "seeds": seeds}
    for p in POLICIES:
        cap[f"{p}_nodes"] = primary[p].nodes
        cap[f"{p}_gpus"] = primary[p].gpus
    i = targets.index(target)
    cap["bound_nodes"], cap["bound_gpus"] = bound_nodes[i], gpus(nodes, bound_nodes[i])
    sweep = {"targets": sweep_rows,
             "p99_by_nodes": {p: {str(n): w for n, w in sorted(tables[p].items())} for p in POLICIES},
             "p99_by_nodes_and_seed": {p: {str(n): {str(s): w for s, w in v.items()}
                                           for n, v in sorted(answers[p][0].by_seed.items())} for p in POLICIES},
             "bound_p99_by_nodes": {str(n): w for n, w in sorted(bound_cache.items())},
             "pooled_fifo_p99_by_nodes": {str(n): w for n, w in sorted(pooled.items())},
             "leave_out": leave_out,
             "gpupool_fewer_nodes_than_fgd_targets_s": [list(span) for span in fewer],
             "gpupool_more_nodes_than_fgd_targets_s": [list(span) for span in more]}
    print(json.dumps(json_ready({"trace": "default", "cores": available_cores(), "policies": figures, "capacity": cap,
                                 "sweep": sweep, "wall_s": spent}), allow_nan=False))


def queues_benchmark(count: int, scale: int, jobs: int) -> None:
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
    print(json.dumps(json_ready({"trace": "default", "cores": available_cores(), "nodes": len(nodes),
                                 "queues": {"count": count, "variants": out}}), allow_nan=False))


if __name__ == "__main__":
    main()
