"""The embedded default: an in-process cluster with fake GPU nodes, the real extender over real HTTP, and
a fake kubelet/agent. `start_embedded` returns handles so that the demo, the dashboard, `gpupool top`,
the tests and the benchmarks all reuse the same building blocks.

Scenario files (YAML) describe node groups and a workload mix; the default one ships inside the package
(`scenarios/default.yaml`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpupool.api.counted import counted_allocation
from gpupool.api.inventory import encode_inventory
from gpupool.api.names import ANN_POLICY, RESOURCE_CORES, RESOURCE_GPU, RESOURCE_MEMORY
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import Conflict, NotFound, Obj
from gpupool.core.model import GPU
from gpupool.scheduler.app import RouteFactory, create_app
from gpupool.scheduler.auth import server_security
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.metrics import SchedulerMetrics
from gpupool.scheduler.server import ServerHandle, serve_in_background
from gpupool.scheduler.service import ExtenderService

log = logging.getLogger(__name__)

SPLIT = 10  # device-plugin slots advertised per GPU


class ScenarioError(ValueError):
    pass


class NodeGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prefix: str = Field(min_length=1)
    count: int = Field(ge=0)
    model: str = Field(min_length=1)
    gpus: int = Field(ge=1, le=16)
    gpu_memory_mib: int = Field(gt=0)
    sm_count: int = Field(default=0, ge=0)
    nvlink: bool = False  # all GPUs of a node joined by NVLink (NVSwitch)
    cpu: int = Field(default=64, gt=0)  # cores
    memory_gib: int = Field(default=512, gt=0)


class PodShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    weight: float = Field(gt=0)
    gpu: int = Field(default=1, ge=1)
    cores: int | None = Field(default=None, ge=1, le=100)  # percent per GPU; None = whole GPU
    memory_mib: int | None = Field(default=None, gt=0)
    cpu_milli: int = Field(default=1000, ge=0)
    models: list[str] = Field(default_factory=list)
    policy: str | None = None


class Workload(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pods: int = Field(default=1000, ge=0)
    namespace: str = "demo"
    mix: list[PodShape] = Field(min_length=1)


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = 1
    name: str = "scenario"
    seed: int = 0
    nodes: list[NodeGroup] = Field(min_length=1)
    workload: Workload

    @property
    def node_count(self) -> int:
        return sum(g.count for g in self.nodes)

    def scaled(self, nodes: int) -> Scenario:
        """The same mix of node groups with about `nodes` nodes in total (each group at least one)."""
        total = self.node_count
        groups = [g.model_copy(update={"count": max(1, round(g.count * nodes / total))}) for g in self.nodes]
        diff = nodes - sum(g.count for g in groups)
        biggest = max(range(len(groups)), key=lambda i: groups[i].count)
        groups[biggest] = groups[biggest].model_copy(update={"count": max(1, groups[biggest].count + diff)})
        return self.model_copy(update={"nodes": groups})


def default_scenario_path() -> Path:
    return Path(str(resources.files("gpupool.demo") / "scenarios" / "default.yaml"))


def load_scenario(path: str | Path | None = None) -> Scenario:
    p = Path(path) if path is not None else default_scenario_path()
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ScenarioError(f"scenario {p}: {e}") from None
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "document"
        raise ScenarioError(f"scenario {p}: {where}: {first['msg']}") from None


# --- objects -------------------------------------------------------------------------------------------


def node_objects(scenario: Scenario) -> list[Obj]:
    """Kubernetes Node objects with the inventory annotation a gpupool agent would write."""
    out: list[Obj] = []
    for group in scenario.nodes:
        for n in range(group.count):
            name = f"{group.prefix}-{n:04d}"
            gpus = [
                GPU(
                    uuid="GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{scenario.name}/{name}/{j}")),
                    index=j,
                    model=group.model,
                    memory_mib=group.gpu_memory_mib,
                    sm_count=group.sm_count,
                    numa_node=0 if j < group.gpus / 2 else 1,
                    nvlink_peers=tuple(k for k in range(group.gpus) if k != j) if group.nvlink else (),
                )
                for j in range(group.gpus)
            ]
            allocatable = {
                "cpu": str(group.cpu),
                "memory": f"{group.memory_gib}Gi",
                RESOURCE_GPU: str(group.gpus * SPLIT),
            }
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "labels": {"gpupool.io/model": group.model, "kubernetes.io/hostname": name},
                        "annotations": {
                            "gpupool.io/inventory": encode_inventory(name, gpus, SPLIT, driver="fake", cuda="fake")
                        },
                    },
                    "status": {"capacity": dict(allocatable), "allocatable": allocatable},
                }
            )
    return out


def pod_object(name: str, namespace: str, shape: PodShape, scheduler_name: str = "gpupool-scheduler") -> Obj:
    limits: dict[str, str] = {RESOURCE_GPU: str(shape.gpu)}
    if shape.cores is not None:
        limits[RESOURCE_CORES] = str(shape.cores)
    if shape.memory_mib is not None:
        limits[RESOURCE_MEMORY] = str(shape.memory_mib)
    annotations: dict[str, str] = {}
    if shape.models:
        annotations["gpupool.io/gpu-model"] = ",".join(shape.models)
    if shape.policy:
        annotations[ANN_POLICY] = shape.policy
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "schedulerName": scheduler_name,
            "containers": [
                {
                    "name": "main",
                    "image": "example/worker",
                    "resources": {"requests": {"cpu": f"{shape.cpu_milli}m"}, "limits": limits},
                }
            ],
        },
    }


def workload_pods(scenario: Scenario, count: int | None = None, first: int = 0) -> list[Obj]:
    """The scenario's workload as pod objects, named job-<first>...; deterministic for a seed and `first`."""
    w = scenario.workload
    n = w.pods if count is None else count
    rng = np.random.default_rng([scenario.seed, first])
    weights = np.array([s.weight for s in w.mix], dtype=float)
    picks = rng.choice(len(w.mix), size=n, p=weights / weights.sum())
    return [pod_object(f"job-{first + i:06d}", w.namespace, w.mix[int(k)]) for i, k in enumerate(picks)]


async def churn(
    emb: Embedded,
    submit: Callable[[list[Obj]], Awaitable[object]],
    lifetime_s: float,
    first: int,
    period_s: float = 1.0,
    seed: int = 0,
) -> None:
    """Keep the embedded cluster busy until cancelled: Running pods finish after about `lifetime_s`
    (phase Succeeded, then deleted, which returns their GPUs) and as many new pods are submitted through
    `submit` (e.g. the fake kube-scheduler's `run`). For dashboards and `gpupool top` under `--serve`."""
    rng = np.random.default_rng(seed)
    next_name = first
    while True:
        await asyncio.sleep(period_s)
        pods, _ = await emb.cluster.list_pods()
        running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        finishing = [p for p in running if rng.random() < period_s / lifetime_s]
        for p in finishing:
            meta = p["metadata"]
            with contextlib.suppress(NotFound, Conflict):
                await emb.cluster.patch_pod_status(meta["namespace"], meta["name"], {"phase": "Succeeded"})
                await emb.cluster.delete_pod(meta["namespace"], meta["name"], uid=meta["uid"])
        # Unschedulable leftovers are dropped too, so the pending queue does not grow without bound.
        for p in pods:
            meta = p["metadata"]
            if not (p.get("spec") or {}).get("nodeName") and (p.get("status") or {}).get("phase") == "Pending":
                with contextlib.suppress(NotFound, Conflict):
                    await emb.cluster.delete_pod(meta["namespace"], meta["name"], uid=meta["uid"])
        arrivals = max(1, len(finishing))
        await submit(workload_pods(emb.scenario, arrivals, first=next_name))
        next_name += arrivals


# --- fake kubelet / agent ------------------------------------------------------------------------------


class FakeKubelet:
    """Plays kubelet plus the gpupool node agent for every node of the embedded cluster: a pod bound with
    its allocation is "started": its phase becomes Running, which frees its node for the next bind
    (gpupool.scheduler.busy)."""

    def __init__(self, cluster: MemoryCluster) -> None:
        self.cluster = cluster
        self.started = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        _, rv = await self.cluster.list_pods()
        self._task = asyncio.create_task(self._run(rv))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self, rv: str) -> None:
        async for event in self.cluster.watch_pods(rv):
            pod = event.object
            if event.type == "DELETED" or (pod.get("status") or {}).get("phase") != "Pending":
                continue
            if counted_allocation(pod) is None:
                continue
            try:
                await self._admit(pod)
            except Exception as e:  # a fake must not die on one pod
                log.warning("fake kubelet: %s", e)

    async def _admit(self, pod: Obj) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(NotFound):
            await self.cluster.patch_pod_status(meta["namespace"], meta["name"], {"phase": "Running"})
            self.started += 1


# --- the whole embedded control plane ------------------------------------------------------------------


@dataclass(slots=True)
class Embedded:
    """Handles to a running embedded cluster + extender. `url` is the extender's base URL."""

    cluster: MemoryCluster
    service: ExtenderService
    server: ServerHandle
    kubelet: FakeKubelet
    scenario: Scenario
    node_names: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    async def stop(self) -> None:
        await self.server.stop()
        await self.kubelet.stop()
        await self.service.stop()
        await self.cluster.close()


async def start_embedded(
    scenario: Scenario,
    config: SchedulerConfig | None = None,
    metrics: SchedulerMetrics | None = None,
    fake_kubelet: bool = True,
    api_latency_s: float = 0.0,
    extra_routes: RouteFactory | None = None,
) -> Embedded:
    """Create the embedded cluster with the scenario's nodes, start the extender on 127.0.0.1 (a free
    port unless the config names one) and the fake kubelet; return once the extender is ready.
    `api_latency_s` delays every call to the embedded API server (tests use it to widen race windows)."""
    if config is None:
        config = SchedulerConfig(port=0, leader_elect=False)
    cluster = MemoryCluster(latency_s=api_latency_s)
    names = []
    for obj in node_objects(scenario):
        await cluster.create_node(obj)
        names.append(obj["metadata"]["name"])
    service = ExtenderService(cluster, config, metrics)
    await service.start()
    kubelet = FakeKubelet(cluster)
    if fake_kubelet:
        await kubelet.start()
    server = await serve_in_background(
        create_app(service, extra_routes), config.host, config.port, security=server_security(config)
    )
    return Embedded(cluster, service, server, kubelet, scenario, names)
