"""`gpupool agent`: the node agent (kubelet device plugin, GPU discovery, health, inventory)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import click


@click.command("agent")
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="YAML file with settings (overridden by NODE_NAME / GPUPOOL_AGENT_* variables and flags).",
)
@click.option("--node-name", default=None, help="This node's name [env NODE_NAME].")
@click.option("--backend", type=click.Choice(["nvml", "amdsmi", "dcmi", "fake"]), default=None,
              help="GPU discovery: nvml (NVIDIA), amdsmi (AMD Instinct), dcmi (Huawei Ascend) or fake [nvml].")
@click.option("--fake-file", type=click.Path(path_type=Path), default=None, help="GPU description for --backend fake.")
@click.option("--split", type=int, default=None, help="Device-plugin slots per GPU (most pods per GPU) [10].")
@click.option(
    "--isolation",
    type=click.Choice(["mps", "hook", "none"]),
    default=None,
    help="Isolation for pods whose allocation names none [hook].",
)
@click.option(
    "--device-plugin-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Kubelet's device-plugin directory [/var/lib/kubelet/device-plugins].",
)
@click.option("--socket-name", default=None, help="The plugin's socket file name [gpupool.sock].")
@click.option("--cdi/--no-cdi", default=None, help="Hand GPUs over as CDI devices [off].")
@click.option("--cdi-kind", default=None, help="CDI kind of the GPU devices [nvidia.com/gpu].")
@click.option("--dra/--no-dra", default=None,
              help="Serve GPUs as DRA driver gpu.gpupool.io instead of the device plugin [off] (docs/claims.md).")
@click.option("--device-plugin-with-dra/--no-device-plugin-with-dra", default=None,
              help="With --dra, serve the device plugin too, so pods asking for gpupool.io/gpu* still run here "
                   "[off] (docs/agent.md).")
@click.option("--kubelet-root", type=click.Path(path_type=Path), default=None,
              help="Kubelet's root directory, with plugins_registry/ and plugins/ (--dra) [/var/lib/kubelet].")
@click.option("--cdi-dir", type=click.Path(path_type=Path), default=None,
              help="Where the container runtime reads CDI specs (--dra) [/var/run/cdi].")
@click.option("--remote-listen", default=None,
              help="Run this node's GPU servers for remote shares on tcp:HOST:PORT (needs --dra, --remote-key) "
                   "[off] (docs/remote.md).")
@click.option("--remote-address", default=None,
              help="The server address pods on other nodes dial, tcp:HOST:PORT [what the server reports; needed "
                   "when --remote-listen names no one host].")
@click.option("--remote-key", "remote_key_file", type=click.Path(path_type=Path), default=None,
              help="File with the cluster's remote key: claims of isolation remote are prepared with tokens "
                   "derived from it [off].")
@click.option("--moves-namespace", default=None,
              help="Namespace of gpupool's moves ConfigMap (gpupool-remote-moves): with --remote-key, follow moves "
                   "of remote shares between GPU servers [off] (docs/remote.md).")
@click.option(
    "--mps-root",
    type=click.Path(path_type=Path),
    default=None,
    help="Host directory with one MPS pipe directory per GPU UUID [/run/gpupool/mps].",
)
@click.option("--reprobe-interval-s", type=float, default=None, help="Re-probe unhealthy GPUs this often [30].")
@click.option("--inventory-interval-s", type=float, default=None, help="Rediscover and refresh inventory [30].")
@click.option("--kubeconfig", default=None, help="Kubeconfig file (default: in-cluster credentials).")
@click.option("--context", default=None, help="Kubeconfig context.")
@click.option("--metrics-port", type=int, default=None, help="Serve /metrics on this port (0: a free one) [off].")
@click.option("--log-level", default=None, help="critical, error, warning, info or debug [info].")
@click.option("--dry-run", is_flag=True, help="Discover the GPUs, print what would be advertised, and exit.")
def agent(config_file: Path | None, dry_run: bool, **flags: Any) -> None:
    """Run the node agent: discover GPUs, publish the node inventory, serve the kubelet device plugin."""
    from gpupool.agent.config import LOADER, ConfigError

    try:
        config = LOADER.load(config_file, flags, os.environ)
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    from gpupool.commands import logs

    logs.configure(config.log_level)
    log = logging.getLogger("gpupool.agent")
    log.info("gpupool agent starting: %s", config.describe())
    from gpupool.agent.checks.toolkit_check import warn_if_unsafe

    warn_if_unsafe(cdi=config.cdi)  # NVIDIA_VISIBLE_DEVICES=all from any pod: see docs/install.md
    backend, vendors = _backend(config)
    if dry_run:
        _print_plan(config, backend)
        return
    from gpupool.agent.state.hookdir import install_packaged_library

    problem = install_packaged_library(config.hook_root)
    if problem is not None:
        log.error("isolation hook cannot be enforced: the CUDA interception library %s", problem)
    _install_hip(config, backend, log)
    if config.remote_key_file is not None:
        _check_remote(config, log)
    from gpupool.agent.state.checkpoint import CheckpointError

    try:
        asyncio.run(_run(config, backend, vendors))
    except CheckpointError as e:  # node state another agent holds, or one it cannot trust: the reason, no trace
        raise click.ClickException(str(e)) from None


def _check_remote(config: Any, log: logging.Logger) -> None:
    """Remote shares: a key that cannot be read stops the agent here with the reason (not a traceback); the
    forwarding library goes where kubelet mounts it from."""
    from gpupool.agent.remote.serving import RemoteKeyError, install_client_library, load_key

    try:
        load_key(config.remote_key_file)
    except RemoteKeyError as e:
        raise click.ClickException(str(e)) from None
    problem = install_client_library(config.hook_root)
    if problem is not None:
        log.error("claims of isolation remote cannot start on this node: %s", problem)


def _backend(config: Any) -> tuple[Any, dict[str, Any]]:
    """The discovery backend of the configured vendor, and the vendor object (NvidiaVendor, AmdVendor,
    AscendVendor) by name: the source of its cards' container devices, which the Agent hands the device plugin
    and the DRA driver (gpupool.agent.isolation.vendors). A fake backend has none: its cards get the fake's
    environment-only devices there."""
    from gpupool.agent.devices.discovery import DiscoveryError

    try:
        if config.backend == "fake":
            from gpupool.agent.devices.fake import FakeBackend

            return FakeBackend.from_file(config.fake_file, node=config.node_name), {}
        if config.backend == "amdsmi":
            from gpupool.agent.devices.amd import AmdVendor

            amd = AmdVendor()
            return amd.discovery, {amd.name: amd}
        if config.backend == "dcmi":
            from gpupool.agent.devices.ascend import AscendBackend, AscendVendor

            ascend = AscendVendor(AscendBackend())
            return ascend.discovery, {ascend.name: ascend}
        from gpupool.agent.devices.nvidia import NvidiaVendor

        nvidia = NvidiaVendor(cdi_kind=config.cdi_kind if config.cdi else None)
        return nvidia.discovery, {nvidia.name: nvidia}
    except DiscoveryError as e:
        raise click.ClickException(str(e)) from None


def _install_hip(config: Any, backend: Any, log: logging.Logger) -> None:
    """A node with AMD cards gets the HIP memory cap beside the CUDA library (AMD hook shares need it; without
    it they are refused with the reason, whole cards still run)."""
    from gpupool.core.vendors import AMD

    if not any(d.vendor == AMD for d in backend.discover().devices):
        return
    from gpupool.agent.state.hookdir import install_hip_library
    from gpupool.hook import hip_library_path

    problem = install_hip_library(config.hook_root, hip_library_path())
    if problem is not None:
        log.error("hook shares of AMD cards cannot be enforced: the HIP memory cap %s", problem)


def _print_plan(config: Any, backend: Any) -> None:
    from gpupool.agent.devices.inventory import inventory_text, labels_for
    from gpupool.agent.devices.slots import slot_id

    discovered = backend.discover()
    unhealthy = {d.uuid: p for d in discovered.devices if (p := backend.probe(d.uuid)) is not None}
    plan = {
        "node": config.node_name,
        "resource": config.resource_name,
        "slots": [slot_id(d.uuid, n) for d in discovered.devices for n in range(config.split)],
        "unhealthy": unhealthy,
        "labels": labels_for(discovered),
        "inventory": json.loads(inventory_text(config.node_name, discovered, unhealthy, config.split, time="")),
    }
    click.echo(json.dumps(plan, indent=2))
    backend.close()


async def _run(config: Any, backend: Any, vendors: Any) -> None:
    from gpupool.agent.port import ClusterPortAgent
    from gpupool.agent.service import Agent

    port = _cluster_port(config)
    node_agent = Agent(config, backend, ClusterPortAgent(port), mps=_mps_supervisor(config, backend),
                       mig=await _mig_manager(config, backend, ClusterPortAgent(port)), vendors=vendors)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, node_agent.request_stop)
    loop.add_signal_handler(signal.SIGHUP, node_agent.revalidate)  # re-run node validation now (docs/agent.md)
    await node_agent.start()
    metrics = None if config.metrics_port is None else await _metrics(node_agent, config)
    try:
        await node_agent.wait()
    finally:
        if metrics is not None:
            await metrics.stop()
        await node_agent.stop()
        await port.close()


def _mps_supervisor(config: Any, backend: Any) -> Any:
    """One MPS control daemon per GPU, supervised by the agent (restarted when it dies, consulted by
    Allocate, shown in the inventory and /metrics; docs/mig-mps.md), where the config asks for them
    (`mps_daemons`, by default where the default isolation is mps)."""
    if not config.runs_mps_daemons:
        return None
    import time

    from gpupool.agent.devices.mps import agent_supervisor

    gpus = [d.uuid for d in backend.discover().devices]
    return agent_supervisor(config.mps_root, gpus, time.monotonic)


async def _mig_manager(config: Any, backend: Any, cluster: Any) -> Any:
    """Isolation mig: the agent carves the instances the scheduler planned (docs/mig-mps.md); only when a
    GPU of the node is in MIG mode, or the node's label lets the agent switch idle GPUs to MIG mode (the
    switching itself happens on the MIG housekeeping passes)."""
    import logging
    import time

    from gpupool.agent.devices.mig import agent_mig_manager, mode_switch_allowed

    try:
        node = await cluster.get_node(config.node_name)
        allowed = mode_switch_allowed((node.get("metadata") or {}).get("labels") or {})
    except Exception as e:  # the API being away at start: no switching until a restart reads the label
        logging.getLogger("gpupool.agent").warning("cannot read node %s's labels at start: %s", config.node_name, e)
        allowed = False
    return agent_mig_manager(backend, config.checkpoint_path, config.mig_idle_after_s, time.time,
                             allow_mode_switch=allowed)


async def _metrics(node_agent: Any, config: Any) -> Any:
    from gpupool.commands.agent_metrics import start_metrics_server

    return await start_metrics_server(node_agent, config.metrics_host, config.metrics_port)


def _cluster_port(config: Any) -> Any:
    """The Kubernetes adapter (in-cluster service account, or the given kubeconfig)."""
    try:
        from gpupool.cluster.kube import KubeCluster
    except ImportError as e:
        raise click.ClickException(f"the Kubernetes adapter is not available: {e}") from None
    return KubeCluster.from_config(config.kubeconfig, config.context)
