"""The agent's /metrics: per-GPU and per-pod device metrics of this node (dcgm-exporter names), plus the
usage the interception library measured per pod. It joins two services (the agent's state, the exporter's
families), so it lives in the entry layer, beside `gpupool agent` that starts it.

What is exported, and from where:
- DCGM_FI_DEV_* per GPU of this node (gpupool.exporter.device), from the agent's device table: total
  memory from discovery, memory used summed from the pods' hook usage (utilisation, temperature, power and
  Xid counts are 0 until the backend samples them: neither discovery backend does yet).
- One DCGM_FI_DEV_FB_USED / DCGM_FI_DEV_GPU_UTIL series per pod holding a grant on the GPU (labels
  namespace/pod/container), with what the hook measured for it; a pod whose processes measured nothing
  yet gets 0, so dashboards list every tenant of a shared GPU from its first second.
- gpupool_pod_gpu_* from the hook directories (gpupool.agent.state.hook_metrics).
- gpupool_mps_daemon_up / gpupool_mps_daemon_restarts_total per GPU, when the agent runs MPS daemons
  (gpupool.agent.devices.mps).
- gpupool_watchdog_kills_total{reason} / _reports_total{reason} and friends, when the watchdog runs
  (gpupool.agent.enforce.watchdog).

The node's pods come from the API (`list_pods_on_node`, the agent's own permission), refreshed in the
background; a scrape never waits for the API. Tenants are the pods the agent served (`gpupool.io/allocated`)
and that are not finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry

from gpupool.agent.devices.mps import MpsCollector
from gpupool.agent.dra.metrics import DraCollector
from gpupool.agent.enforce.watchdog import WatchdogCollector
from gpupool.agent.remote.serving import MovesCollector, RemoteCollector
from gpupool.agent.service import Agent
from gpupool.agent.state.hook_metrics import HookUsageCollector
from gpupool.agent.state.hookdir import read_all
from gpupool.api.allocation import AllocationError, decode_allocation
from gpupool.api.names import ANN_ALLOCATED, ANN_ALLOCATION
from gpupool.exporter.cgroup import PodRef
from gpupool.exporter.device import DeviceCollector, DeviceSample, ProcessSample
from gpupool.exporter.http import create_metrics_app
from gpupool.scheduler.server import BodyTimeout, ConnectionLimits, guarded_protocol

log = logging.getLogger("gpupool.agent.metrics")
_MIB = 1024 * 1024
_FINISHED = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class Tenant:
    ref: PodRef
    uid: str
    gpus: tuple[str, ...]


def tenants(pods: Sequence[Mapping[str, Any]], node: str) -> list[Tenant]:
    """Pods of `node` the agent served and that still run, with the GPUs their allocation grants."""
    out = []
    for p in pods:
        meta = p.get("metadata") or {}
        ann = meta.get("annotations") or {}
        if (p.get("spec") or {}).get("nodeName") != node or ANN_ALLOCATED not in ann or ANN_ALLOCATION not in ann:
            continue
        if (p.get("status") or {}).get("phase") in _FINISHED:
            continue
        try:
            doc = decode_allocation(ann[ANN_ALLOCATION])
        except AllocationError:
            continue
        containers = (p.get("spec") or {}).get("containers") or [{}]
        ref = PodRef(str(meta.get("namespace", "")), str(meta.get("name", "")), str(containers[0].get("name", "")))
        out.append(Tenant(ref, str(meta.get("uid", "")), tuple(g.uuid for g in doc.gpus)))
    return out


class NodeMetrics:
    """Scrape-time samples for DeviceCollector. Each tenant enters a GPU's sample as one ProcessSample
    whose `pid` is its position in the scrape's tenant list (the hook reports usage per pod, not per
    process), and `pod_of` resolves that position back to the pod."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.pods: list[Tenant] = []
        self._scrape: list[Tenant] = []

    def samples(self) -> list[DeviceSample]:
        table = self.agent.table
        if table is None:
            return []
        used: dict[tuple[str, str], float] = {}  # (pod uid, GPU uuid) -> MiB measured by the hook
        for u in read_all(self.agent.config.hook_root):
            used[(u.pod_uid, u.gpu)] = used.get((u.pod_uid, u.gpu), 0.0) + u.used_bytes / _MIB
        self._scrape = list(self.pods)
        out = []
        for d in sorted(table.known.values(), key=lambda d: d.index):
            procs = tuple(ProcessSample(pid=i, used_memory_mib=used.get((t.uid, d.uuid), 0.0))
                          for i, t in enumerate(self._scrape) if d.uuid in t.gpus)
            out.append(DeviceSample(
                index=d.index, uuid=d.uuid, model=d.model, hostname=self.agent.config.node_name,
                gpu_util=0.0, fb_used_mib=sum(p.used_memory_mib for p in procs), fb_total_mib=float(d.memory_mib),
                temperature_c=0.0, power_w=0.0,
                pci_bus_id=d.pci_bus_id, processes=procs, vendor=d.vendor,
            ))
        return out

    def pod_of(self, key: int) -> PodRef | None:
        return self._scrape[key].ref if 0 <= key < len(self._scrape) else None

    async def refresh(self, interval_s: float) -> None:
        node = self.agent.config.node_name
        while True:
            try:
                self.pods = tenants(await self.agent.cluster.list_pods_on_node(node), node)
            except Exception as e:  # the API being away must not end the metrics: keep the last list
                log.warning("metrics: cannot list the pods of node %s: %s", node, e)
            await asyncio.sleep(interval_s)


@dataclass
class MetricsServer:
    server: uvicorn.Server
    tasks: list[asyncio.Task[Any]]
    port: int

    async def stop(self) -> None:
        self.server.should_exit = True
        for task in self.tasks[1:]:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, timeout=5)


# Scraped by Prometheus (one connection per scraper, every 15 s or more): a slow or idle client loses its
# connection, and no address may hold more than a few (gpupool.scheduler.server.ConnectionLimits).
METRICS_LIMITS = ConnectionLimits(header_timeout_s=10.0, body_timeout_s=10.0, keep_alive_s=5.0, max_connections=64,
                                  max_per_peer=8)


async def start_metrics_server(agent: Agent, host: str, port: int, refresh_s: float = 2.0,
                               limits: ConnectionLimits = METRICS_LIMITS) -> MetricsServer:
    """Serve /metrics on host:port (0 = a free port) until `stop()`; returns once it listens."""
    registry = CollectorRegistry()
    node = NodeMetrics(agent)
    DeviceCollector(node.samples, node.pod_of, registry=registry)
    registry.register(HookUsageCollector(agent.config.hook_root))
    if agent.mps is not None:  # gpupool_mps_daemon_up / _restarts_total per GPU
        registry.register(MpsCollector(agent.mps))
    if agent.watchdog is not None:  # gpupool_watchdog_kills_total{reason}, ... (gpupool.agent.enforce.watchdog)
        registry.register(WatchdogCollector(agent.watchdog))
    if agent.dra is not None:  # gpupool_dra_claims_prepared, gpupool_dra_prepare_seconds (gpupool.agent.dra.driver)
        registry.register(DraCollector(agent.dra))
    if agent.remote is not None:  # gpupool_remote_* (gpupool.agent.remote.serving)
        registry.register(RemoteCollector(agent.remote))
    if agent.moves is not None:
        registry.register(MovesCollector(agent.moves))
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    config = uvicorn.Config(BodyTimeout(create_metrics_app(registry), limits.body_timeout_s), log_level="warning",
                            access_log=False, lifespan="off", timeout_keep_alive=max(1, round(limits.keep_alive_s)),
                            http=guarded_protocol(limits))
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    refreshing = asyncio.create_task(node.refresh(refresh_s))
    while not server.started:
        if serving.done():
            refreshing.cancel()
            serving.result()  # raises the start-up error
        await asyncio.sleep(0.01)
    bound = int(sock.getsockname()[1])
    log.info("metrics on http://%s:%d/metrics", host, bound)
    return MetricsServer(server, [serving, refreshing], bound)
