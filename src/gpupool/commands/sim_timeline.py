"""`gpupool simulate --timeline [--target-wait-p99 D]`: the trace on its own clock, and how many nodes it
needs for a wait target (gpupool.sim.timeline, gpupool.sim.capacity)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from gpupool.commands.sim_progress import run_with_bar
from gpupool.core.model import Node
from gpupool.core.queues import QueueConfigError, QueueSpec, QueueTree
from gpupool.sim.capacity import PRECISION, TimelineResult, timeline_job
from gpupool.sim.parallel import Job
from gpupool.sim.team_queues import QueueFileError, even_queues, queues_from_file
from gpupool.sim.timeline import TimedPod
from gpupool.sim.timeline_report import json_ready, plot_timeline, summarise_timeline

_UNITS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """'90', '90s', '5m', '1.5h', '2d' -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?\s*", text)
    if not m:
        raise click.BadParameter(f"{text!r}: expected a duration such as 90s, 5m or 2h", param_hint="--target-wait-p99")
    return float(m.group(1)) * _UNITS[m.group(2) or ""]


def _seconds(x: float) -> str:
    if x == float("inf"):
        return "never"
    return f"{x:,.0f} s" if x < 3600 else f"{x / 3600:,.1f} h"


def queue_specs(arg: str, nodes: Sequence[Node]) -> list[QueueSpec]:
    """--queues N (each guaranteed 1/N of the GPUs) or --queues FILE.yaml; a usage error otherwise."""
    if arg.strip().isdigit():
        count = int(arg)
        if not 1 <= count <= 1000:
            raise click.BadParameter(f"{arg}: between 1 and 1000 queues", param_hint="--queues")
        return even_queues(count, nodes)
    path = Path(arg)
    if not path.is_file():
        raise click.BadParameter(f"{arg!r} is neither a number of queues nor a YAML file", param_hint="--queues")
    try:
        specs = queues_from_file(path)
        QueueTree.build(specs)
    except (QueueFileError, QueueConfigError) as e:
        raise click.BadParameter(str(e), param_hint="--queues") from None
    return specs


def _queue_table(console: Console, results: Sequence[TimelineResult], names: list[str]) -> dict[str, Any]:
    table = Table(title="Team queues (waits over the queue's pods; GPU-hours until the replay's end)")
    for col in ("policy", "queue", "pods", "wait p50", "p99", "never ran", "GPU-h served", "GPU-h guaranteed",
                "preempted"):
        table.add_column(col, justify="left" if col in ("policy", "queue") else "right")
    doc: dict[str, Any] = {}
    for name, r in zip(names, results, strict=True):
        assert r.queues is not None
        doc[name] = r.queues
        for q, f in r.queues.items():
            if q.startswith("_"):
                continue
            table.add_row(name, q, f"{f['pods']:,}", _seconds(f["wait_p50_s"]), _seconds(f["wait_p99_s"]),
                          str(f["never_ran"]), f"{f['gpu_hours_served']:,.1f}", f"{f['gpu_hours_guaranteed']:,.1f}",
                          str(f["preemptions"]))
        table.add_row(name, "(all)", "", "", "", "", "", f"lost to evictions: {r.queues['_lost_gpu_hours']:,.1f}",
                      "")
    console.print(table)
    return doc


def run(console: Console, trace: str, nodes: Sequence[Node], pods: Sequence[TimedPod], names: list[str],
        seeds: Sequence[int], workers: int, out: Path, speedup: float, target_s: float | None,
        queues: Sequence[QueueSpec] | None = None, order: str = "fifo") -> int:
    """Replay with the first seed's tie-breaks, print, write; the capacity search needs the target met on every
    seed. Returns the exit code (2: no size tried meets the target)."""
    seed = seeds[0]
    jobs = [Job(name, seed) for name in names]
    results: list[TimelineResult] = run_with_bar(console, timeline_job, nodes, pods, jobs, workers, target_s=target_s,
                                                 queues=queues, order=order, seeds=list(seeds))
    summary = {name: summarise_timeline(r.log) for name, r in zip(names, results, strict=True)}
    table = Table(title=f"Timeline replay ({trace}, {len(nodes):,} nodes, seed {seed}; waits over all pods, "
                        "never ran = waits forever)")
    for col in ("policy", "wait p50", "p95", "p99", "never ran", "GPUs alloc mean", "p10", "mean %", "frag mean %"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, s in summary.items():
        table.add_row(name, _seconds(s["wait_p50_s"]), _seconds(s["wait_p95_s"]), _seconds(s["wait_p99_s"]),
                      f"{s['never_ran']} ({s['never_ran_pct']:.2f} %)", f"{s['gpu_alloc_mean']:.1f}",
                      f"{s['gpu_alloc_p10']:.1f}", f"{s['gpu_alloc_mean_pct']:.2f}", f"{s['frag_mean_pct']:.2f}")
    console.print(table)
    doc: dict[str, Any] = {"seed": seed, "nodes": len(nodes), "policies": summary}
    if queues:
        doc["queues"] = {"order": order, "policies": _queue_table(console, results, names)}
    code = 0
    if target_s is not None:
        seed_text = ", ".join(str(s) for s in seeds)
        cap = Table(title=f"Nodes needed for wait p99 <= {_seconds(target_s)} on every seed ({seed_text}; bisection "
                          f"to {PRECISION:.0%} of the answer or 1 node; node mix kept)")
        for col in ("policy", "nodes", "GPUs", "longest wait p99 there", "sizes tried"):
            cap.add_column(col, justify="left" if col == "policy" else "right")
        doc["capacity"] = {"target_wait_p99_s": target_s, "precision": PRECISION, "seeds": list(seeds),
                           "policies": {}}
        for name, r in zip(names, results, strict=True):
            a = r.capacity
            assert a is not None
            doc["capacity"]["policies"][name] = {
                "nodes": a.nodes, "gpus": a.gpus, "tried": {str(k): v for k, v in sorted(a.tried.items())},
                "tried_by_seed": {str(k): {str(s): w for s, w in v.items()} for k, v in sorted(a.by_seed.items())}}
            if a.nodes is None:
                best_n, best_w = a.best
                cap.add_row(name, "none", "-", f"best: {_seconds(best_w)} at {best_n:,} nodes", str(len(a.tried)))
                code = 2
            else:
                cap.add_row(name, f"{a.nodes:,}", f"{a.gpus:,}", _seconds(a.tried[a.nodes]), str(len(a.tried)))
        console.print(cap)
        if code:
            click.echo(f"error: no cluster size up to 4x the node list meets wait p99 <= {_seconds(target_s)} for "
                       "every policy (best found shown above)", err=True)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    current: dict[str, Any] = {}
    if path.exists():
        try:
            current = json.loads(path.read_text())
        except ValueError:
            current = {}
    if current.get("trace") != trace:
        current = {"trace": trace}
    current["timeline"] = doc
    path.write_text(json.dumps(json_ready(current), indent=1, allow_nan=False))
    png = plot_timeline(out, trace, {name: r.log for name, r in zip(names, results, strict=True)}, speedup)
    console.print(f"wrote {path} and {png}")
    return code
