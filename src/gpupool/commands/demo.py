"""`gpupool demo`: the scheduler service over real HTTP against the embedded cluster of fake GPU nodes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import click

from gpupool.core.policies import policy_names


@click.command("demo")
@click.option("--scenario", "scenario_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Scenario YAML (node groups and workload). Default: the bundled scenario.")
@click.option("--nodes", type=click.IntRange(min=1), help="Rescale the scenario's node groups to about N nodes.")
@click.option("--pods", type=click.IntRange(min=0), help="Number of pods to submit (default: the scenario's).")
@click.option("--policy", type=click.Choice(policy_names()), help="Default placement policy.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Extender port on 127.0.0.1 (0 = a free port).")
@click.option("--weight", type=click.IntRange(min=1), default=1, show_default=True,
              help="Extender weight the fake kube-scheduler applies to prioritize scores.")
@click.option("--serve", is_flag=True, help="Keep running after the workload (until Ctrl-C) so tools can attach.")
@click.option("--churn", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="With --serve: pods finish after about SECONDS and new ones arrive, so the pool keeps moving.")
def demo(
    scenario_path: Path | None, nodes: int | None, pods: int | None, policy: str | None, port: int, weight: int,
    serve: bool, churn: float | None,
) -> None:
    """Start an embedded cluster of fake GPU nodes, the gpupool extender on 127.0.0.1 and a fake
    kube-scheduler that submits the scenario's workload over HTTP (filter -> prioritize -> bind).
    For a real Kubernetes 1.37 cluster with gpupool installed from its chart, run
    `scripts/k8s-testbed up --nodes 2 --gpupool` from a source checkout (docs/e2e.md)."""
    from gpupool.demo.embedded import ScenarioError, load_scenario

    try:
        scenario = load_scenario(scenario_path)
    except ScenarioError as e:
        raise click.UsageError(str(e)) from None
    if churn is not None and not serve:
        raise click.UsageError("--churn only makes sense with --serve")
    if nodes is not None:
        scenario = scenario.scaled(nodes)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run(scenario, pods, policy, port, weight, serve, churn))


async def _run(
    scenario: Any, pods: int | None, policy: str | None, port: int, weight: int, serve: bool, churn: float | None
) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from gpupool.commands.pool_views import pool_views
    from gpupool.commands.signals import until_stopped
    from gpupool.core.policies import DEFAULT_POLICY
    from gpupool.demo.embedded import churn as keep_busy
    from gpupool.demo.embedded import start_embedded, workload_pods
    from gpupool.demo.kube_scheduler import KubeSchedulerDriver, Outcome
    from gpupool.scheduler.config import SchedulerConfig

    console = Console()
    config = SchedulerConfig(port=port, leader_elect=False, default_policy=policy or DEFAULT_POLICY)
    console.print(f"[bold]gpupool demo[/] scenario={scenario.name} nodes={scenario.node_count}")
    console.print(f"scheduler config: {config.describe()}")
    emb = await start_embedded(scenario, config, extra_routes=pool_views())
    state = emb.service.ledger.state
    console.print(f"extender listening on [cyan]{emb.url}[/] ({len(state)} nodes, {state.total_gpus} GPUs)")
    workload = workload_pods(scenario, pods)
    driver = KubeSchedulerDriver(emb.url, emb.cluster, emb.node_names, weight=weight, seed=scenario.seed)
    reasons: dict[str, int] = {}
    try:
        with Progress(
            TextColumn("scheduling"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        ) as progress:
            task = progress.add_task("pods", total=len(workload))

            def on_outcome(o: Outcome) -> None:
                progress.advance(task)
                if o.node is None:
                    reasons[o.reason] = reasons.get(o.reason, 0) + 1

            start = time.perf_counter()
            stats = await driver.run(workload, on_outcome)
            elapsed = time.perf_counter() - start
        await asyncio.sleep(0.2)  # let the watch confirm the last binds
        check = await emb.service.debug_ledger()
        table = Table(title="summary", show_header=False)
        rate = len(workload) / elapsed if elapsed > 0 else 0.0
        table.add_row("pods submitted", str(len(workload)))
        table.add_row("bound", str(stats.bound))
        table.add_row("unschedulable", str(stats.unschedulable))
        table.add_row("bind retries", str(stats.bind_retries))
        table.add_row("decisions per second", f"{rate:.0f}")
        used = int((state.gpu_sharers > 0).sum())
        table.add_row("GPUs in use", f"{used} / {state.total_gpus}")
        if state.total_gpus:
            table.add_row("compute allocated", f"{100 * state.allocated_milli() / (1000 * state.total_gpus):.1f} %")
        diff = check["diff"]
        problems = sum(len(v) for v in diff.values())
        table.add_row("ledger vs API", "consistent" if problems == 0 else f"[red]{problems} difference(s)[/]")
        console.print(table)
        for why, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:5]:
            console.print(f"  unschedulable x{n}: {why}")
        if serve:
            console.print(
                f"serving: dashboard {emb.url}/ui  pool {emb.url}/pool  metrics {emb.url}/metrics"
                f"  ledger {emb.url}/debug/ledger\n"
                f"terminal view: gpupool top --url {emb.url}/pool  (Ctrl-C to stop)"
            )
            busy = None
            if churn is not None:
                console.print(f"churn: pods finish after about {churn:g}s and are replaced")
                busy = asyncio.create_task(keep_busy(emb, driver.run, churn, first=len(workload), seed=scenario.seed))
            await until_stopped()
            if busy is not None:
                busy.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await busy
    finally:
        await driver.close()
        await emb.stop()
