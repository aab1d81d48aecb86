"""`gpupool scheduler`: serve the kube-scheduler extender against a real cluster, with leader election."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from gpupool.core.policies import policy_names

if TYPE_CHECKING:
    from gpupool.scheduler.config import SchedulerConfig


@click.command("scheduler")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="YAML file with SchedulerConfig fields (flags and GPUPOOL_SCHEDULER_* env vars override it).")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False),
              help="Kubeconfig file (default: the in-cluster service account).")
@click.option("--context", help="Kubeconfig context.")
@click.option("--host", help="Listen address (default 127.0.0.1: kube-scheduler in the same pod).")
@click.option("--port", type=click.IntRange(0, 65535), help="Listen port (default 8888).")
@click.option("--default-policy", type=click.Choice(policy_names()), help="Policy for pods that name none.")
@click.option("--leader-elect/--no-leader-elect", default=None, help="Lease-based leader election (default on).")
@click.option("--lease-namespace", help="Namespace of the leader-election Lease.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
def scheduler(
    config_file: Path | None, kubeconfig: str | None, context: str | None, host: str | None, port: int | None,
    default_policy: str | None, leader_elect: bool | None, lease_namespace: str | None, log_level: str,
) -> None:
    """Serve /filter, /prioritize and /bind for kube-scheduler (see docs/scheduler.md for its config)."""
    from gpupool.commands import logs
    from gpupool.scheduler.auth import server_security
    from gpupool.scheduler.config import LOADER, ConfigError

    logs.configure(log_level)
    flags = {
        "kubeconfig": kubeconfig, "context": context, "host": host, "port": port, "default_policy": default_policy,
        "leader_elect": leader_elect, "lease_namespace": lease_namespace,
    }
    try:
        config = LOADER.load(config_file, flags, os.environ)
        server_security(config)  # a non-loopback listener without TLS or a token never starts
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    click.echo(f"gpupool scheduler config: {config.describe()}")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(config))


async def _serve(config: SchedulerConfig) -> None:
    from gpupool.cluster.kube import KubeCluster
    from gpupool.commands.pool_views import pool_views
    from gpupool.commands.signals import until_stopped
    from gpupool.scheduler.heap import keep_frozen
    from gpupool.scheduler.runner import start_replica

    source = config.kubeconfig or "the in-cluster service account"
    try:
        cluster = KubeCluster.from_config(config.kubeconfig, config.context)
    except Exception as e:
        raise click.ClickException(f"cannot load cluster credentials from {source}: {e}") from None
    try:
        replica = await start_replica(cluster, config, extra_routes=pool_views())
    except Exception as e:  # exit with the reason; the pod's restart policy retries
        await cluster.close()
        raise click.ClickException(f"cannot start: listing nodes and pods from the API server failed: {e!r}") from None
    click.echo(f"extender listening on {replica.url} (ready after sync and, if enabled, leader election); "
               f"pool views at {replica.url}/ui, {replica.url}/pool and {replica.url}/metrics")
    keep_frozen()  # short collector pauses over the cached cluster (gpupool.scheduler.heap)
    try:
        await until_stopped()
    finally:
        await replica.stop()
        await cluster.close()
