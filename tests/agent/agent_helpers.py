"""Helpers for the agent tests: a fake GPU description, what the scheduler writes at bind, and an agent
wired to a stand-in kubelet over real unix sockets in a short temporary directory."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.discovery import Discovered
from gpupool.agent.devices.fake import FakeBackend, parse_fake_description
from gpupool.agent.devices.mig import MigManager
from gpupool.agent.devices.mps import Answer, MpsConfig, MpsSupervisor
from gpupool.agent.port import ClusterPortAgent
from gpupool.agent.service import Agent
from gpupool.api.allocation import AllocationDoc, GrantDoc
from gpupool.api.names import ANN_ALLOCATION, RESOURCE_GPU
from gpupool.cluster.memory import MemoryCluster
from tests.harness.kubelet import StandInKubelet

NODE = "gpu-node-1"
RESOURCE = RESOURCE_GPU
_uid = itertools.count(1)


def four_gpus() -> Discovered:
    return parse_fake_description(
        {
            "driver_version": "570.86",
            "cuda_version": "12.8",
            "gpus": [
                {"uuid": "GPU-aaaa-0", "model": "A100-80GB", "memory_mib": 81920, "numa_node": 0, "nvlink_peers": [1]},
                {"uuid": "GPU-aaaa-1", "model": "A100-80GB", "memory_mib": 81920, "numa_node": 0, "nvlink_peers": [0]},
                {"uuid": "GPU-aaaa-2", "model": "A100-80GB", "memory_mib": 81920, "numa_node": 1},
                {"uuid": "GPU-aaaa-3", "model": "A100-80GB", "memory_mib": 81920, "numa_node": 1},
            ],
        },
        "test",
    )


def pod_object(name: str, gpus: int, namespace: str = "default", node: str | None = None) -> dict[str, Any]:
    """A GPU pod; with `node`, bound there directly (spec.nodeName), the way a pod bypasses the scheduler."""
    spec: dict[str, Any] = {
        "schedulerName": "gpupool-scheduler",
        "containers": [{"name": "main", "resources": {"limits": {RESOURCE_GPU: str(gpus)}}}],
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}-{next(_uid)}", "annotations": {}},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


async def scheduler_binds(
    cluster: MemoryCluster,
    pod: dict[str, Any],
    grants: list[tuple[str, int, int, float]],
    isolation: str = "hook",
    node: str = NODE,
) -> dict[str, Any]:
    """What the gpupool scheduler does at bind: write the allocation, bind (the Node is not written).
    `grants` are (uuid, index, memory MiB, cores percent)."""
    created = await cluster.create_pod(pod)
    meta = created["metadata"]
    doc = AllocationDoc(
        pod_uid=meta["uid"],
        node=node,
        isolation=isolation,
        time="2026-11-21T06:00:00Z",
        gpus=[GrantDoc(uuid=u, index=i, memory_mib=m, cores=c) for u, i, m, c in grants],
    )
    await cluster.patch_pod_annotations(meta["namespace"], meta["name"], {ANN_ALLOCATION: doc.model_dump_json()})
    await cluster.create_binding(meta["namespace"], meta["name"], meta["uid"], node)
    return await cluster.get_pod(meta["namespace"], meta["name"])


def answering_mps(directory: Path, gpus: list[str]) -> MpsSupervisor:
    """MPS daemons for `gpus` that start and answer every command (MPS shares are served only where the
    agent runs a daemon that answers); pipe and log directories under `directory`."""

    def runner(argv: list[str], env: dict[str, str], stdin: str, timeout_s: float) -> Answer:
        return Answer(True, "100")

    config = MpsConfig(pipe_root=directory / "mps", log_root=directory / "mps-log")
    return MpsSupervisor(config, gpus, lambda: 0.0, runner=runner)


@dataclass
class Rig:
    cluster: MemoryCluster
    backend: FakeBackend
    kubelet: StandInKubelet
    agent: Agent
    config: AgentConfig
    mps: MpsSupervisor | None = None
    mig: Callable[[], MigManager] | None = None  # makes the agent's MIG manager (a new one per agent run)

    async def restart_agent(self, step: Callable[[str], None] | None = None) -> None:
        """Stop the agent and start a new one on the same node, backend state, kubelet and checkpoint
        directory; `step` is the new agent's Allocate step hook."""
        await self.agent.stop()
        self.agent = Agent(self.config, self.backend, ClusterPortAgent(self.cluster), step=step, mps=self.mps,
                           mig=None if self.mig is None else self.mig())
        await self.agent.start()


class NodeCalls(ClusterPortAgent):
    """The device plugin's view of the cluster, counting what it asks of the Node object."""

    def __init__(self, port: MemoryCluster) -> None:
        super().__init__(port)
        self.node_reads = 0
        self.node_writes = 0

    async def get_node(self, name: str) -> dict[str, Any]:
        self.node_reads += 1
        return await super().get_node(name)

    async def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> dict[str, Any]:
        self.node_writes += 1
        return await super().patch_node_annotations(name, annotations, resource_version)

    async def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> dict[str, Any]:
        self.node_writes += 1
        return await super().patch_node_labels(name, labels)


def count_node_calls(r: Rig) -> NodeCalls:
    """Route the running agent's device plugin (Allocate, GetPreferredAllocation) through a NodeCalls."""
    assert r.agent.service is not None
    calls = NodeCalls(r.cluster)
    r.agent.service.cluster = calls
    return calls


def agent_config(directory: Path, **overrides: Any) -> AgentConfig:
    values: dict[str, Any] = {
        "node_name": NODE,
        "backend": "fake",
        "fake_file": directory / "gpus.yaml",
        "split": 4,
        "device_plugin_dir": directory,
        # Never the host's /run/gpupool/hook: where a `gpupool agent` once ran, concurrent test runs would
        # share (and clean up) each other's pod directories there. Tests of the hook pass their own root.
        "hook_root": directory / "hook",
        # Nor the host's kubelet root and CDI directory, for agents that are DRA drivers (dra=True).
        "kubelet_root": directory / "kubelet",
        "cdi_dir": directory / "cdi",
        "watch_interval_s": 0.05,
        "reprobe_interval_s": 0.05,
        "inventory_interval_s": 0.2,
        "event_wait_s": 0.05,
    }
    values.update(overrides)
    return AgentConfig(**values)


@asynccontextmanager
async def rig(
    discovered: Discovered | None = None,
    cluster: MemoryCluster | None = None,
    step: Callable[[str], None] | None = None,
    mps: MpsSupervisor | None = None,
    mig: Callable[[], MigManager] | None = None,
    **overrides: Any,
) -> AsyncIterator[Rig]:
    # unix socket paths are limited to ~107 bytes: keep the directory short
    directory = Path(tempfile.mkdtemp(prefix="gpa-", dir="/tmp"))
    cluster = cluster or MemoryCluster()
    await cluster.create_node(
        {
            "metadata": {"name": NODE, "annotations": {"keep/me": "yes"}, "labels": {"zone": "a"}},
            "status": {"allocatable": {"cpu": "32", "memory": "256Gi"}},
        }
    )
    backend = FakeBackend(discovered or four_gpus())
    config = agent_config(directory, **overrides)
    kubelet = StandInKubelet(directory)
    await kubelet.start()
    agent = Agent(config, backend, ClusterPortAgent(cluster), step=step, mps=mps, mig=None if mig is None else mig())
    await agent.start()
    r = Rig(cluster, backend, kubelet, agent, config, mps, mig)
    try:
        await kubelet.wait_for(lambda k: RESOURCE in k.plugins and k.plugins[RESOURCE].updates > 0)
        yield r
    finally:
        await r.agent.stop()
        await kubelet.stop()
        shutil.rmtree(directory, ignore_errors=True)


async def eventually(predicate, timeout: float = 10.0, step: float = 0.01) -> None:  # type: ignore[no-untyped-def]
    """Poll until predicate() is true; the timeout only prevents a hang."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached before the timeout")
        await asyncio.sleep(step)


async def scrape_metrics(r: Rig) -> str:
    """The agent's /metrics page, from the real metrics server on a free port (stopped afterwards)."""
    import httpx

    from gpupool.commands.agent_metrics import start_metrics_server

    server = await start_metrics_server(r.agent, "127.0.0.1", 0, refresh_s=60)
    try:
        async with httpx.AsyncClient() as client:
            return (await client.get(f"http://127.0.0.1:{server.port}/metrics")).text
    finally:
        await server.stop()
