"""Shared pieces for the scheduler tests: small scenarios and a running embedded extender."""

from __future__ import annotations

import httpx
import pytest

from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.embedded import NodeGroup, PodShape, Scenario, Workload, start_embedded


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
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }


def plain_pod(name: str) -> dict:
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "1"}}}]}}


@pytest.fixture
async def embedded():
    emb = await start_embedded(small_scenario(), SchedulerConfig(port=0, leader_elect=False, lock_wait_s=2.0))
    yield emb
    await emb.stop()


@pytest.fixture
async def client():
    async with httpx.AsyncClient(timeout=30) as c:
        yield c
