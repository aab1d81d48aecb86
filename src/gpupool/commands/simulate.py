"""`gpupool simulate`: replay a trace against placement policies and report unallocated GPUs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

DEFAULT_POLICIES = "random,dotprod,clustering,packing,bestfit,fgd,gpupool"
# Policies by replay time on the bundled traces, slowest first (an ordering for load balance only).
SLOW_FIRST = {"gpupool": 0, "fgd": 1, "random": 2, "clustering": 3, "packing": 4, "bestfit": 5, "dotprod": 6}


MAX_SEED = 2**32 - 1  # numpy's generators take any non-negative integer; a seed people type fits 32 bits
MAX_SEEDS = 1000
MAX_MOVES = 8  # the planner's work grows with the subsets of this many shares per GPU


def _int_list(text: str) -> list[int]:
    parts = [s for s in text.split(",") if s.strip()]
    if len(parts) > MAX_SEEDS:
        raise click.BadParameter(f"{len(parts)} seeds, at most {MAX_SEEDS}", param_hint="--seeds")
    try:
        seeds = [int(s) for s in parts if len(s.strip()) <= 20]
    except ValueError:
        seeds = []
    if len(seeds) != len(parts) or not all(0 <= s <= MAX_SEED for s in seeds):
        raise click.BadParameter(f"{text[:80]!r}: expected comma-separated integers from 0 to {MAX_SEED} such "
                                 "as 42,43", param_hint="--seeds")
    return seeds


class Between(click.ParamType[float]):
    """A number from `lo` to `hi` (click's FloatRange lets nan through: every comparison with it is false)."""

    name = "number"

    def __init__(self, lo: float, hi: float) -> None:
        self.lo, self.hi = lo, hi

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            x = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not self.lo <= x <= self.hi:  # false for nan
            self.fail(f"{value!r} is not between {self.lo:g} and {self.hi:g}", param, ctx)
        return x


@click.command("simulate")
@click.option("--trace", default="default", show_default=True,
              help="Bundled trace (default, gpushare100, multigpu50) or a pod CSV path in the same format.")
@click.option("--nodes", "nodes_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Node CSV (sn,cpu_milli,memory_mib,gpu,model). Default: the trace's 1,213 GPU nodes.")
@click.option("--policies", default=DEFAULT_POLICIES, show_default=True, help="Comma-separated policy names.")
@click.option("--seeds", default=None, help="Comma-separated seeds (default 42 and up, see --num-seeds).")
@click.option("--num-seeds", type=click.IntRange(1, 100), default=3, show_default=True,
              help="Number of seeds starting at 42, when --seeds is not given.")
@click.option("--jobs", "workers", type=click.IntRange(1, 256), default=None,
              help="Replays run at once, one process each (default: the number of usable cores).")
@click.option("--timeline", is_flag=True,
              help="Replay on the trace's own clock (creation, scheduled, deletion times) with a FIFO queue.")
@click.option("--speedup", type=Between(1, 1e6), default=1.0, show_default=True,
              help="With --timeline: compress the time axis of timeline.png (display only, never the figures).")
@click.option("--target-wait-p99", "target", default=None,
              help="With --timeline: find the smallest scaled node list whose p99 wait meets this (90s, 5m, 2h).")
@click.option("--constrain-models", "constrain", type=Between(0, 1), default=None,
              help="Make this share of GPU pods name GPU models of the node list (seeded variant, seed 0).")
@click.option("--gpu-model", default=None,
              help="What-if: replay as if every GPU were this model, per --isolation (gpupool mig whatif).")
@click.option("--isolation", default="whole,mig,hook", show_default=True,
              help="With --gpu-model: the isolations to compare (whole, mig, hook).")
@click.option("--max-shares-per-gpu", "max_sharers", type=click.IntRange(min=0), default=0, show_default=True,
              help="Hold each GPU to this many pods, as the scheduler holds it to its node's split (0: no limit, "
                   "FGD's protocol).")
@click.option("--moves", "max_moves", type=int, default=0, show_default=True,
              help="Static replay: a pod that fits nowhere may be placed after at most this many moves of movable "
                   "shares (gpupool.core.moves); reports unallocated % with and without moves (0: off).")
@click.option("--move-cost-per-gib", "move_cost", type=float, default=1.0, show_default=True,
              help="With --moves: the cost of moving 1 GiB of GPU memory; plans are ranked by it (then by moves), "
                   "0 ranks them by moves first.")
@click.option("--movable", "movable", type=float, default=1.0, show_default=True,
              help="With --moves: the fraction of placed one-GPU shares that may move (seeded, per pod).")
@click.option("--vendor-mix", "vendor_mix", default=None,
              help="Static replay: make these shares of the GPU nodes AMD / Ascend nodes and draw each GPU pod's "
                   "runtime with them (amd=0.3,ascend=0.1; NVIDIA gets the rest; any=0.2: pods that run "
                   "anywhere); reports unallocated % for one pool against per-vendor islands.")
@click.option("--queues", "queues_arg", default=None,
              help="With --timeline: team queues, N (each guaranteed 1/N of the GPUs, pods by a hash of their "
                   "name) or a YAML file (docs/queues.md).")
@click.option("--order", "queue_order", type=click.Choice(["fifo", "priority", "fair"]), default="fifo",
              show_default=True,
              help="With --queues: the order pending pods are tried in.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("sim-out"),
              show_default=True, help="Directory for results.json and allocation.png.")
def simulate(trace: str, nodes_path: Path | None, policies: str, seeds: str | None, num_seeds: int,
             workers: int | None, timeline: bool, speedup: float, target: str | None, constrain: float | None,
             gpu_model: str | None, isolation: str, max_sharers: int, max_moves: int, move_cost: float,
             movable: float, vendor_mix: str | None, queues_arg: str | None, queue_order: str, out: Path) -> None:
    """Replay a GPU cluster trace on a simulated cluster and compare placement policies.

    Follows the FGD (ATC '23) protocol: pods shuffled per seed, topped up to 130 % of the cluster's GPU
    capacity, placed one at a time, dropped when they fit nowhere. Prints unallocated GPU % at arrived
    demand = 100 % (mean ± std over seeds) and writes results.json and allocation.png.

    With --moves N, each policy is also replayed with moves allowed (a pod that fits nowhere is placed after
    at most N moves of movable shares, the cheapest by GPU memory moved): the table and results.json give
    unallocated % with and without moves, the moves made and the GiB they moved.

    With --vendor-mix, that share of the GPU nodes become AMD or Ascend nodes (the catalogue's MI300X and
    Ascend 910B), each GPU pod's runtime is drawn with the same shares (seeded), and each policy is also
    replayed on one pool (every pod placed only on cards of its runtime) and on per-vendor islands; a table
    and results.json give the unallocated % of each and the pods placed on a card of another runtime.

    With --timeline, replays the trace on its own clock instead (with the first seed's tie-breaks): waits,
    pods that never ran, GPU allocation and fragmentation over time, timeline.png; with --target-wait-p99,
    also the nodes each policy needs to meet it on every seed (exit 2 when no size tried does); with
    --queues, pods join team queues with the scheduler's admission and reclaim rules.

    Input is bounded (gpupool.sim.trace): at most 32 GPUs per node and per pod, 100,000 nodes, CPU and
    memory up to 10^12, times up to 10^10 s, 512 MiB per file; seeds 0 to 2^32-1. Anything else is
    refused with the file, line and column, and exit status 2.
    """
    from rich.console import Console
    from rich.table import Table

    from gpupool.commands import sim_timeline
    from gpupool.commands.sim_progress import run_with_bar
    from gpupool.commands.sim_timeline import parse_duration
    from gpupool.core.policies import REGISTRY, policy_names
    from gpupool.sim.constrain import constrain_models
    from gpupool.sim.parallel import Job, available_cores
    from gpupool.sim.replay import replay
    from gpupool.sim.report import plot, summarise, summarise_moves, write_results
    from gpupool.sim.timeline import timed_pods
    from gpupool.sim.trace import (
        NODES_FILE,
        TRACE_DIR,
        TraceError,
        load_nodes,
        load_pods,
        load_times,
        resolve_trace,
    )

    if gpu_model is not None:
        from gpupool.commands.mig import whatif

        click.get_current_context().invoke(whatif, trace=trace, nodes_path=nodes_path, gpu_model=gpu_model,
                                           isolation=isolation, seed=_int_list(seeds)[0] if seeds else 42,
                                           as_json=False)
        return
    console = Console()
    workers = workers or available_cores()
    names = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in REGISTRY]
    if unknown or not names:
        raise click.UsageError(
            f"unknown policy {', '.join(unknown) or '(none given)'}; valid policies: {', '.join(policy_names())}"
        )
    seed_list = _int_list(seeds) if seeds else list(range(42, 42 + num_seeds))
    if not seed_list:
        raise click.BadParameter("no seeds given", param_hint="--seeds")
    if target is not None and not timeline:
        raise click.UsageError("--target-wait-p99 needs --timeline")
    target_s = parse_duration(target) if target is not None else None
    if queues_arg is not None and not timeline:
        raise click.UsageError("--queues needs --timeline")
    if max_moves < 0 or max_moves > MAX_MOVES:
        raise click.UsageError(f"--moves {max_moves}: expected a number of moves from 0 to {MAX_MOVES}")
    if not 0 <= move_cost <= 1e9:  # false for nan
        raise click.UsageError(f"--move-cost-per-gib {move_cost}: expected a number from 0 to 1e9")
    if not 0 <= movable <= 1:
        raise click.UsageError(f"--movable {movable}: expected a fraction from 0 to 1")
    if max_moves and timeline:
        raise click.UsageError("--moves applies to the static replay, not to --timeline")
    if max_sharers and timeline:
        raise click.UsageError("--max-shares-per-gpu applies to the static replay, not to --timeline")
    mix = _vendor_mix(vendor_mix, timeline, max_moves, max_sharers) if vendor_mix is not None else None
    try:
        node_list = load_nodes(nodes_path or TRACE_DIR / NODES_FILE)
        pods = load_pods(resolve_trace(trace))
        times = load_times(resolve_trace(trace)) if timeline else None
    except TraceError as e:
        click.echo(f"error: {e}", err=True)  # plain echo: rich would wrap the file:line:column text
        raise SystemExit(2) from None
    if constrain is not None:
        pods = constrain_models(pods, node_list, constrain)
    gpus = sum(len(n.gpus) for n in node_list)
    if gpus == 0:
        click.echo("error: the node list has no GPUs", err=True)
        raise SystemExit(2)
    if mix is not None:
        from gpupool.sim.vendor_mix import VendorMixError, node_counts

        try:
            node_counts(mix, sum(1 for n in node_list if n.gpus))
        except VendorMixError as e:
            raise click.UsageError(f"--vendor-mix {vendor_mix}: {e}") from None
    queue_specs = sim_timeline.queue_specs(queues_arg, node_list) if queues_arg is not None else None
    console.print(f"trace [bold]{trace}[/bold]: {len(pods):,} pods on {len(node_list):,} nodes with {gpus:,} GPUs; "
                  f"seeds {seed_list}; policies {', '.join(names)}")
    if times is not None:
        code = sim_timeline.run(console, trace, node_list, timed_pods(pods, times), names, seed_list, workers,
                                out, speedup, target_s, queue_specs, queue_order)
        raise SystemExit(code)
    jobs = [Job(name, seed) for name in names for seed in seed_list]
    # Slowest first, so that no core is left with one long replay at the end.
    order = sorted(range(len(jobs)), key=lambda k: SLOW_FIRST.get(jobs[k].policy, len(SLOW_FIRST)))
    logs = run_with_bar(console, replay, node_list, pods, [jobs[k] for k in order], workers,
                        **({"max_sharers": max_sharers} if max_sharers else {}))
    by_job = dict(zip(order, logs, strict=True))
    results = {}
    for name in names:
        results[name] = summarise([by_job[k] for k, job in enumerate(jobs) if job.policy == name])
    if max_moves:
        options = {"moves": max_moves, "move_cost_per_gib": move_cost, "movable": movable,
                   **({"max_sharers": max_sharers} if max_sharers else {})}
        moved = run_with_bar(console, replay, node_list, pods, [jobs[k] for k in order], workers, **options)
        by_moved = dict(zip(order, moved, strict=True))
        for name in names:
            results[name]["moves"] = summarise_moves(
                [by_moved[k] for k, job in enumerate(jobs) if job.policy == name], max_moves, move_cost, movable)
    if mix is not None:
        from gpupool.sim.vendor_mix import compare

        def run(fn: Any, mixed_nodes: Any, mixed_pods: Any, mixed_jobs: Any, **options: Any) -> list[Any]:
            return run_with_bar(console, fn, mixed_nodes, mixed_pods, mixed_jobs, workers, **options)

        vendors = compare(node_list, pods, mix, names, seed_list, run)
        for name in names:
            results[name]["vendor_mix"] = {k: v for k, v in vendors.items() if k != "policies"} | \
                vendors["policies"][name]
    table = Table(title=f"Unallocated GPU % at arrived demand = 100 % ({trace}, {len(seed_list)} seeds)")
    for col in ("policy", "unallocated @100 %", "± std", "unallocated @130 %", "frag @100 %", "s/seed"):
        table.add_column(col, justify="right" if col != "policy" else "left")
    for name, r in sorted(results.items(), key=lambda kv: kv[1]["unallocated_pct_at_100"]):
        table.add_row(name, f"{r['unallocated_pct_at_100']:.2f}", f"{r['std_pct_at_100']:.2f}",
                      f"{r['unallocated_pct_at_130']:.2f}", f"{r['fragmented_pct_at_100']:.2f}",
                      f"{r['seconds_per_seed']:.1f}")
    console.print(table)
    if max_moves:
        console.print(_moves_table(results, trace, len(seed_list), max_moves, move_cost, movable))
    if mix is not None:
        console.print(_vendor_table(results, trace, len(seed_list)))
    path = write_results(out, trace, seed_list, results)
    png = plot(out, trace, results)
    console.print(f"wrote {path} and {png}")


def _moves_table(results: dict[str, Any], trace: str, seeds: int, max_moves: int, cost: float,
                 movable: float) -> Any:
    from rich.table import Table

    table = Table(title=f"Unallocated GPU % with at most {max_moves} move(s) per pod ({trace}, {seeds} seeds; "
                        f"{movable:g} of the one-GPU shares movable; cost {cost:g} per GiB); moves and GiB moved "
                        "until that point, mean per seed")
    for col in ("policy", "@100 % no moves", "moves", "GiB", "with moves", "@130 % no moves", "moves", "GiB",
                "with moves"):
        table.add_column(col, justify="right" if col != "policy" else "left")
    for name, r in sorted(results.items(), key=lambda kv: kv[1]["moves"]["unallocated_pct_at_100"]):
        m = r["moves"]
        table.add_row(name, f"{r['unallocated_pct_at_100']:.2f}", f"{m['moves_at_100']:g}",
                      f"{m['moved_gib_at_100']:.1f}", f"{m['unallocated_pct_at_100']:.2f}",
                      f"{r['unallocated_pct_at_130']:.2f}", f"{m['moves_at_130']:g}", f"{m['moved_gib_at_130']:.1f}",
                      f"{m['unallocated_pct_at_130']:.2f}")
    return table


def _vendor_mix(text: str, timeline: bool, max_moves: int, max_sharers: int) -> Any:
    """The parsed --vendor-mix, or a usage error (exit 2) that names what is wrong."""
    from gpupool.sim.vendor_mix import VendorMixError, parse_mix

    if timeline:
        raise click.UsageError("--vendor-mix applies to the static replay, not to --timeline")
    if max_moves or max_sharers:
        raise click.UsageError("--vendor-mix is not combined with --moves or --max-shares-per-gpu")
    try:
        return parse_mix(text)
    except VendorMixError as e:
        raise click.UsageError(f"--vendor-mix {text[:80]}: {e}") from None


def _vendor_table(results: dict[str, Any], trace: str, seeds: int) -> Any:
    from rich.table import Table

    first = next(iter(results.values()))["vendor_mix"]
    vendors = ", ".join(f"{v} {d['nodes']} nodes / {d['gpus']} GPUs / {d['pods']} pods"
                        for v, d in first["vendors"].items())
    table = Table(title=f"Unallocated GPU % at arrived demand = 100 %, one pool against per-vendor islands ({trace}, "
                        f"{seeds} seeds; mix {first['mix']}: {vendors})")
    islands = list(first["vendors"])
    for col in ("policy", "one pool", "islands", *(f"island {v}" for v in islands), "misrouted"):
        table.add_column(col, justify="right" if col != "policy" else "left")
    for name, r in sorted(results.items(), key=lambda kv: kv[1]["vendor_mix"]["unallocated_pct_one_pool"]):
        m = r["vendor_mix"]
        per = m["unallocated_pct_per_island"]
        table.add_row(name, f"{m['unallocated_pct_one_pool']:.2f}", f"{m['unallocated_pct_islands']:.2f}",
                      *(f"{per[v]:.2f}" if v in per else "-" for v in islands), str(m["misrouted"]))
    return table
