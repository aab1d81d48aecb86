"""`gpupool webhook`: serve the admission webhook over TLS."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    import uvicorn

    from gpupool.webhook.config import WebhookConfig
    from gpupool.webhook.server import CertReloader


@click.command("webhook")
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="YAML file with settings (overridden by GPUPOOL_WEBHOOK_* variables and flags).",
)
@click.option("--host", default=None, help="Address to listen on [0.0.0.0].")
@click.option("--port", type=int, default=None, help="HTTPS port [8443].")
@click.option("--cert-file", type=click.Path(path_type=Path), default=None, help="PEM serving certificate.")
@click.option("--key-file", type=click.Path(path_type=Path), default=None, help="PEM private key.")
@click.option("--scheduler-name", default=None, help="schedulerName given to GPU pods [gpupool-scheduler].")
@click.option("--default-isolation", default=None, help="Isolation written into pods without one [hook].")
@click.option(
    "--trusted-user",
    "trusted_users",
    multiple=True,
    help="User allowed to write gpupool.io/allocation (the scheduler's service account).",
)
@click.option(
    "--allow-privileged/--refuse-privileged",
    default=None,
    help="Whether privileged containers may ask for GPU shares [refuse].",
)
@click.option("--max-body-bytes", type=int, default=None, help="Largest AdmissionReview accepted [3 MiB].")
@click.option(
    "--watch-inventory/--no-watch-inventory",
    default=None,
    help="Read node GPU inventories from the cluster to refuse oversize requests [on].",
)
@click.option("--kubeconfig", default=None, help="Kubeconfig file [in-cluster service account].")
@click.option("--context", default=None, help="Kubeconfig context.")
@click.option("--log-level", default=None, help="critical, error, warning, info or debug [info].")
def webhook(config_file: Path | None, **flags: object) -> None:
    """Serve the admission webhook (mutating /mutate, validating /validate) over TLS."""
    from gpupool.webhook.config import LOADER, ConfigError

    try:
        config = LOADER.load(config_file, flags, os.environ)
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    if config.cert_file is None or config.key_file is None:
        raise click.UsageError("the webhook serves HTTPS only: give --cert-file and --key-file")
    for path in (config.cert_file, config.key_file):
        if not path.is_file():
            raise click.UsageError(f"certificate file {path} does not exist")
    from gpupool.commands import logs

    logs.configure(config.log_level)
    click.echo(f"gpupool webhook starting: {config.summary()}", err=True)  # whatever the log level
    asyncio.run(_run(config))


def serving(app: Any, config: WebhookConfig) -> tuple[uvicorn.Server, CertReloader]:
    """The webhook's uvicorn server for `app` and the reloader of its certificate, with the transport
    bounds of `config` (gpupool.scheduler.server: the TLS handshake and headers within header_timeout_s,
    the body within body_timeout_s, connections capped in total and per peer)."""
    from gpupool.scheduler.server import BodyTimeout, ConnectionLimits, guarded_protocol
    from gpupool.webhook.server import CertReloader, build_server, tls_context

    assert config.cert_file is not None and config.key_file is not None  # checked by the command
    limits = ConnectionLimits(header_timeout_s=config.header_timeout_s, body_timeout_s=config.body_timeout_s,
                              keep_alive_s=config.keep_alive_s, max_connections=config.max_connections,
                              max_per_peer=config.max_connections_per_peer)
    context = tls_context(config.cert_file, config.key_file)
    server = build_server(BodyTimeout(app, limits.body_timeout_s), config.host, config.port, config.log_level,
                          guarded_protocol(limits, context), config.keep_alive_s)
    return server, CertReloader(context, config.cert_file, config.key_file)


async def _run(config: WebhookConfig) -> None:
    from gpupool.webhook.app import create_app
    from gpupool.webhook.inventory import InventoryView, follow
    from gpupool.webhook.server import serve

    assert config.cert_file is not None and config.key_file is not None  # checked by the command
    settings = config.settings()  # the admission settings and namespace policies
    inventory = InventoryView()
    background: list[asyncio.Task[None]] = []
    port = None
    if config.watch_inventory:
        from gpupool.cluster.kube import KubeCluster

        port = KubeCluster.from_config(config.kubeconfig, config.context)
        background.append(asyncio.create_task(follow(port, inventory)))
    app = create_app(settings, inventory, config.max_body_bytes)
    server, reloader = serving(app, config)
    try:
        await serve(server, config.cert_reload_s, background, reloader)
    finally:
        if port is not None:
            await port.close()
