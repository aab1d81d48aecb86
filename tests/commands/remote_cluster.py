"""A small cluster of GPU servers for `gpupool migrate` and `gpupool drain` (a MemoryCluster: the API server's
semantics, resourceVersions and evictions included).

Three GPU nodes of 2 GPUs of 16384 MiB, each GPU published with a GPU server (`remoteServer`), except GPU 1 of
gpu-0002, which is tainted; a GPU-less node `cpu-0` where remote clients run."""

from __future__ import annotations

from typing import Any

from gpupool.api.dra import DRIVER, SliceDevice, resource_slices
from gpupool.api.moves import MOVES_CONFIGMAP, Move, read_moves
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import CONFIGMAPS, RESOURCE_CLAIMS, RESOURCE_SLICES, NotFound, Obj
from gpupool.demo.embedded import node_objects
from tests.scheduler.conftest import small_scenario

NS = "gp-system"
GPU_NODES = ("gpu-0000", "gpu-0001", "gpu-0002")


async def remote_cluster() -> MemoryCluster:
    cluster = MemoryCluster()
    for obj in node_objects(small_scenario(nodes=3, gpus=2)):
        node = await cluster.create_node(obj)
        name = node["metadata"]["name"]
        devices = [SliceDevice(i, f"{name}-{i}", "A100-80GB", 16384, remote_server=f"tcp:{name}:7070",
                               taints=(("gpu.gpupool.io/unhealthy", "xid", "2025-01-01T00:00:00Z"),)
                               if (name, i) == ("gpu-0002", 1) else ()) for i in range(2)]
        for s in resource_slices(name, node["metadata"]["uid"], devices, "550.54", 1):
            await cluster.create_object(RESOURCE_SLICES, s)
    await cluster.create_node({"metadata": {"name": "cpu-0"}})
    return cluster


def claim(name: str, node: str, gpu: int, memory_mib: int, cores: int, isolation: str = "remote",
          namespace: str = "team") -> Obj:
    config = [{"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"isolation": isolation}}}]
    result = {"request": "gpu", "driver": DRIVER, "pool": node, "device": f"gpu-{gpu}",
              "consumedCapacity": {"memory": f"{memory_mib}Mi", "cores": str(cores)}}
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
            "status": {"allocation": {"devices": {"results": [result], "config": config}}}}


async def add_claim(cluster: MemoryCluster, *args: Any, **kwargs: Any) -> str:
    made = await cluster.create_object(RESOURCE_CLAIMS, claim(*args, **kwargs))
    return str(made["metadata"]["uid"])


async def add_pod(cluster: MemoryCluster, name: str, node: str, claims: list[str], namespace: str = "team",
                  **spec: Any) -> Obj:
    pod = {"metadata": {"name": name, "namespace": namespace},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}],
                    "resourceClaims": [{"name": f"r{i}", "resourceClaimName": c} for i, c in enumerate(claims)],
                    **spec},
           "status": {"phase": "Running"}}
    return await cluster.create_pod(pod)


async def moves_of(cluster: MemoryCluster) -> dict[str, Move]:
    try:
        return read_moves(await cluster.get_object(CONFIGMAPS, MOVES_CONFIGMAP, NS))
    except NotFound:
        return {}


async def set_move(cluster: MemoryCluster, uid: str, move: Move) -> None:
    try:
        await cluster.patch_object(CONFIGMAPS, MOVES_CONFIGMAP, {"data": {uid: move.to_json()}}, namespace=NS)
    except NotFound:
        await cluster.create_object(CONFIGMAPS, {"metadata": {"name": MOVES_CONFIGMAP, "namespace": NS},
                                                 "data": {uid: move.to_json()}})


class Clock:
    """A fake clock whose sleep advances it, and runs `on_sleep` (an agent's step) first."""

    def __init__(self) -> None:
        self.now = 0.0
        self.on_sleep: list[Any] = []
        self.sleeps = 0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        if self.on_sleep:
            await self.on_sleep.pop(0)()
        self.now += max(seconds, 0.5)
