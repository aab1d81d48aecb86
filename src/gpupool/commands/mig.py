"""`gpupool mig`: the MIG geometry gpupool plans with, and what-if planning for a trace.

    gpupool mig models                         the GPU models and their profiles
    gpupool mig layouts --model A100-40GB      every maximal layout (no further instance fits)
    gpupool mig whatif --trace default --gpu-model H100-80GB --isolation whole,mig,hook
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from gpupool.core.mig import MigModel, known_models, maximal_layouts, mig_model


def _model_or_exit(name: str) -> MigModel:
    model = mig_model(name)
    if model is None:
        raise click.UsageError(f"unknown GPU model {name!r}; known models: {', '.join(known_models())}")
    return model


@click.group("mig")
def mig() -> None:
    """MIG geometry (profiles, start slots, layouts) and what-if planning."""


@mig.command("models")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of a table.")
def models(as_json: bool) -> None:
    """List the MIG-capable GPU models and their profiles. Rows marked * hold inferred values."""
    table = {name: _model_or_exit(name) for name in known_models()}
    if as_json:
        click.echo(json.dumps({"models": [
            {"model": m.name, "memory_slices": m.memory_slices, "compute_slices": m.compute_slices,
             "inferred": m.inferred,
             "profiles": [{"profile": p.name, "id": p.profile_id, "compute_slices": p.compute_slices,
                           "memory_slices": p.memory_slices, "starts": list(p.starts), "max": p.max_count,
                           "memory_mib": p.memory_mib, "inferred": p.inferred} for p in m.profiles]}
            for m in table.values()]}))
        return
    for m in table.values():
        click.echo(f"{m.name}: {m.memory_slices} memory slices, {m.compute_slices} compute slices"
                   + (f"  * {m.inferred}" if m.inferred else ""))
        for p in m.profiles:
            ident = "?" if p.profile_id is None else str(p.profile_id)
            note = f"  * {p.inferred}" if p.inferred else ""
            click.echo(f"  {p.name:<12} id {ident:>2}  {p.compute_slices}g  {p.memory_slices} slice(s)  "
                       f"starts {','.join(map(str, p.starts)):<13} max {p.max_count}  {p.memory_mib} MiB{note}")


@mig.command("layouts")
@click.option("--model", "model_name", required=True, help="GPU model, e.g. A100-40GB (see `gpupool mig models`).")
@click.option("--json", "as_json", is_flag=True, help='One object {"model": ..., "layouts": [[{"profile", "start"}]]}.')
@click.option("--without-media", is_flag=True, help="Leave out layouts that use a +me profile.")
def layouts(model_name: str, as_json: bool, without_media: bool) -> None:
    """Print every valid maximal layout of a GPU model: instances with profile and start slot."""
    model = _model_or_exit(model_name)
    found = [lay for lay in maximal_layouts(model.name)
             if not (without_media and any("+me" in i.profile for i in lay))]
    if as_json:
        click.echo(json.dumps({"model": model.name, "layouts": [
            [{"profile": i.profile, "start": i.start} for i in lay] for lay in found]}))
        return
    click.echo(f"{model.name}: {len(found)} maximal layouts (profile@start slot)")
    for lay in found:
        click.echo("  " + " + ".join(f"{i.profile}@{i.start}" for i in lay))


@mig.command("whatif")
@click.option("--trace", default="default", show_default=True,
              help="Bundled trace (default, gpushare100, multigpu50) or a pod CSV path.")
@click.option("--nodes", "nodes_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Node CSV; only its GPU counts are used. Default: the bundled trace's nodes.")
@click.option("--gpu-model", required=True, help="Treat every GPU as this model, e.g. H100-80GB.")
@click.option("--isolation", default="whole,mig,hook", show_default=True,
              help="Comma-separated: whole, mig, hook.")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=42, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of a table.")
def whatif(trace: str, nodes_path: Path | None, gpu_model: str, isolation: str, seed: int, as_json: bool) -> None:
    """What the trace would cost if every GPU were GPU_MODEL: per isolation, the unallocated GPU % when
    arrived demand reaches 100 % of the cluster, and the GPUs needed to host every pod once."""
    from gpupool.core.mig_whatif import ISOLATIONS, what_if
    from gpupool.sim.trace import NODES_FILE, TRACE_DIR, TraceError, load_nodes, load_pods, resolve_trace

    model = _model_or_exit(gpu_model)
    names = [s.strip() for s in isolation.split(",") if s.strip()]
    bad = [n for n in names if n not in ISOLATIONS]
    if bad or not names:
        raise click.UsageError(f"unknown isolation {', '.join(bad) or '(none given)'}; "
                               f"valid: {', '.join(ISOLATIONS)}")
    try:
        nodes = load_nodes(nodes_path or TRACE_DIR / NODES_FILE)
        pods = load_pods(resolve_trace(trace))
    except TraceError as e:
        click.echo(f"error: {e}", err=True)
        raise SystemExit(2) from None
    counts = [len(n.gpus) for n in nodes if n.gpus]
    if not counts:
        click.echo("error: the node list has no GPUs", err=True)
        raise SystemExit(2)
    rows = what_if(counts, pods, model.name, names, seed=seed)
    if as_json:
        click.echo(json.dumps({"trace": trace, "gpu_model": model.name, "gpus": sum(counts), "seed": seed,
                               "rows": [{"isolation": r.isolation, "unallocated_pct": round(r.unallocated_pct, 2),
                                         "gpus_needed": r.gpus_needed, "placed": r.placed, "dropped": r.dropped}
                                        for r in rows]}))
        return
    click.echo(f"trace {trace}: {len(pods):,} pods; {sum(counts):,} GPUs as {model.name}; seed {seed}")
    click.echo(f"{'isolation':<10} {'unallocated % @100 %':>21} {'GPUs needed':>12} {'placed':>7} {'dropped':>8}")
    for r in rows:
        click.echo(f"{r.isolation:<10} {r.unallocated_pct:>21.2f} {r.gpus_needed:>12,} {r.placed:>7,} {r.dropped:>8,}")
