"""Shared pieces for the scheduler tests: small scenarios and a running embedded extender."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gpupool.api.extender import ExtenderBindingArgs
from gpupool.api.queue import LABEL_QUEUE
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import CRDS, NAMESPACES
from gpupool.demo.embedded import NodeGroup, PodShape, Scenario, Workload, node_objects, start_embedded
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.framework.plugins.queue_reclaim import QueueReclaim
from gpupool.scheduler.queues import GPUQUEUES
from gpupool.scheduler.service import ExtenderService


def small_scenario(nodes: int = 2, gpus: int = 8, memory_mib: int = 16384) -> Scenario:
    return Scenario(
        name="test",
        nodes=[NodeGroup(prefix="gpu", count=nodes, model="A100-80GB", gpus=gpus, gpu_memory_mib=memory_mib,
                         nvlink=True, cpu=1000, memory_gib=4096)],
        workload=Workload(pods=0, mix=[PodShape(weight=1, gpu=1, cores=50)]),
    )


def gpu_pod(name: str, cores: int | str | None = 50, memory: int | str | None = None, gpus: int | str = 1,
            namespace: str = "default", annotations: dict | None = None) -> dict:
    limits = {"gpupool.io/gpu": str(gpus)}
    if cores is not None:
        limits["gpupool.io/gpu-cores"] = str(cores)
    if memory is not None:
        limits["gpupool.io/gpu-memory"] = str(memory)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
        "spec": {"schedulerName": "gpupool-scheduler",
                 "containers": [{"name": "main", "resources": {"limits": limits}}]},
    }


def decided(answer: dict, names: list[str]) -> bool:
    """A /filter answer that decided the pod's node (decide_in_filter): one offered node and no error."""
    return len(answer.get("NodeNames") or []) == 1 and answer["NodeNames"][0] in names and not answer.get("Error")


def plain_pod(name: str) -> dict:
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulerName": "gpupool-scheduler",
                     "containers": [{"name": "main", "resources": {"requests": {"cpu": "1"}}}]}}


@pytest.fixture
async def embedded():
    emb = await start_embedded(small_scenario(), SchedulerConfig(port=0, leader_elect=False, lock_wait_s=2.0))
    yield emb
    await emb.stop()


@pytest.fixture
async def listing():
    """Like `embedded`, with /filter answering every feasible node (decide_in_filter off)."""
    config = SchedulerConfig(port=0, leader_elect=False, lock_wait_s=2.0, decide_in_filter=False)
    emb = await start_embedded(small_scenario(), config)
    yield emb
    await emb.stop()


@pytest.fixture
async def client():
    async with httpx.AsyncClient(timeout=30) as c:
        yield c


async def started_service(nodes: int = 2, gpus: int = 8, config: SchedulerConfig | None = None) -> ExtenderService:
    """An extender service over an embedded cluster of `nodes` fake GPU nodes (gpu-0000, ...), synced."""
    cluster = MemoryCluster()
    for obj in node_objects(small_scenario(nodes=nodes, gpus=gpus)):
        await cluster.create_node(obj)
    svc = ExtenderService(cluster, config or SchedulerConfig(leader_elect=False))
    await svc.start()
    return svc


def bind_args(pod: dict, node: str = "gpu-0000") -> ExtenderBindingArgs:
    m = pod["metadata"]
    return ExtenderBindingArgs(PodName=m["name"], PodNamespace=m["namespace"], PodUID=m["uid"], Node=node)


def record_pod_reads(cluster: MemoryCluster) -> list[str]:
    """From now on, the names of the pods read with get_pod (to show which reads a path avoids)."""
    reads: list[str] = []
    get_pod = cluster.get_pod

    async def counting_get_pod(namespace: str, name: str) -> dict:
        reads.append(name)
        return await get_pod(namespace, name)

    cluster.get_pod = counting_get_pod  # type: ignore[method-assign]
    return reads


async def eventually(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    """Wait until predicate() holds (watch events are asynchronous); the timeout only prevents a hang."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


QUEUE_CRD = Path(__file__).resolve().parents[2] / "deploy/helm/gpupool/crds/gpuqueues.yaml"


async def queue_service(queues: dict[str, dict[str, Any]], gpus: int) -> ExtenderService:
    """One node with `gpus` GPUs, the chart's GPUQueue CRD and `queues`; namespaces team-a and team-b join
    the queues of the same names."""
    svc = await started_service(nodes=1, gpus=gpus)
    cluster = svc.cluster
    await cluster.create_object(CRDS, yaml.safe_load(QUEUE_CRD.read_text()))
    for team in ("team-a", "team-b"):
        await cluster.create_object(NAMESPACES, {"metadata": {"name": team, "labels": {LABEL_QUEUE: team}}})
    for name, spec in queues.items():
        await cluster.create_object(GPUQUEUES, {"metadata": {"name": name}, "spec": spec})
    await eventually(lambda: svc.queues.enabled and set(queues) <= set(svc.queues.queues.tree.specs)
                     and svc.queues.queue_of("team-b") == "team-b")
    return svc


def reclaim(svc: ExtenderService) -> QueueReclaim:
    plugin = svc.framework.plugin("queue_reclaim")
    assert isinstance(plugin, QueueReclaim)
    return plugin
