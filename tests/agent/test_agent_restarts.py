"""R11/R12: kubelet restarts (socket directory wiped, new kubelet.sock) and agent restarts with pods."""

from __future__ import annotations

import asyncio
import copy
import shutil
import tempfile
from pathlib import Path

import grpc
import pytest

from gpupool.agent.devices.fake import FakeBackend
from gpupool.agent.identify import ANN_ALLOCATED
from gpupool.agent.port import ClusterPortAgent
from gpupool.agent.service import Agent
from gpupool.api.names import ANN_INVENTORY
from gpupool.cluster.memory import MemoryCluster
from tests.agent.agent_helpers import NODE, RESOURCE, agent_config, four_gpus, pod_object, rig, scheduler_binds
from tests.harness.kubelet import StandInKubelet


async def test_kubelet_restart_twenty_times_reregisters_every_time() -> None:
    async with rig() as r:
        k = r.kubelet
        ids_before = set(k.plugins[RESOURCE].devices)
        await scheduler_binds(r.cluster, pod_object("running", 1), [("GPU-aaaa-0", 0, 8192, 20.0)])
        await k.allocate(RESOURCE, "default/running", 1)
        for i in range(20):
            await k.restart()
            assert RESOURCE not in k.plugins  # the new kubelet knows nothing until the plugin registers
            await k.wait_for(
                lambda k, n=i + 2: (
                    len(k.registrations) == n and RESOURCE in k.plugins and len(k.healthy(RESOURCE)) == 16
                )
            )
            # same device IDs every time (the checkpoint stays valid) and none flips to unhealthy
            assert set(k.plugins[RESOURCE].devices) == ids_before
        assert r.agent.registrations == 21
        # after all that, Allocate still works through the re-created socket
        await scheduler_binds(r.cluster, pod_object("after", 1), [("GPU-aaaa-1", 1, 4096, 10.0)])
        resp = await k.allocate(RESOURCE, "default/after", 1)
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaaa-1"


async def not_inventory(cluster: MemoryCluster) -> dict[str, str]:
    """The node's annotations other than the inventory the agent publishes."""
    annotations = (await cluster.get_node(NODE))["metadata"].get("annotations") or {}
    return {k: v for k, v in annotations.items() if k != ANN_INVENTORY}


async def test_agent_restart_leaves_pods_alone_and_readopts_state() -> None:
    async with rig() as r:
        k = r.kubelet
        await scheduler_binds(r.cluster, pod_object("running", 1), [("GPU-aaaa-0", 0, 8192, 20.0)])
        await k.allocate(RESOURCE, "default/running", 1)
        await r.cluster.patch_pod_status("default", "running", {"phase": "Running"})
        # a second pod is bound but kubelet has not admitted it yet when the agent restarts
        await scheduler_binds(r.cluster, pod_object("inflight", 1), [("GPU-aaaa-2", 2, 30000, 40.0)])
        pods_before = {p["metadata"]["name"]: copy.deepcopy(p) for p in (await r.cluster.list_pods())[0]}
        node_before = await not_inventory(r.cluster)
        ids_before = set(k.plugins[RESOURCE].devices)

        await r.restart_agent()
        assert r.agent.adopted == {"served": 1, "waiting": 1}
        await k.wait_for(lambda k: len(k.registrations) == 2 and len(k.healthy(RESOURCE)) == 16)

        pods_after = {p["metadata"]["name"]: p for p in (await r.cluster.list_pods())[0]}
        assert pods_after == pods_before  # not one write to any pod
        assert await not_inventory(r.cluster) == node_before  # the node: only its inventory is the agent's
        assert set(k.plugins[RESOURCE].devices) == ids_before
        # the restarted agent serves the in-flight pod from the API state, and only that pod
        resp = await k.allocate(RESOURCE, "default/inflight", 1)
        assert resp.envs["GPUPOOL_MEMORY_LIMIT_MIB"] == "30000" and resp.envs["GPUPOOL_CORES_PERCENT"] == "40"
        running = await r.cluster.get_pod("default", "running")
        assert (
            running["metadata"]["annotations"][ANN_ALLOCATED]
            == pods_before["running"]["metadata"]["annotations"][ANN_ALLOCATED]
        )


async def test_agent_started_before_kubelet_registers_when_kubelet_appears() -> None:
    directory = Path(tempfile.mkdtemp(prefix="gpa-", dir="/tmp"))
    cluster = MemoryCluster()
    await cluster.create_node({"metadata": {"name": NODE}})
    agent = Agent(agent_config(directory), FakeBackend(four_gpus()), ClusterPortAgent(cluster))
    await agent.start()
    kubelet = StandInKubelet(directory)
    try:
        assert agent.registrations == 0 and agent.config.plugin_socket_path.exists()
        await kubelet.start()
        await kubelet.wait_for(lambda k: RESOURCE in k.plugins and len(k.healthy(RESOURCE)) == 16)
        assert agent.registrations == 1
    finally:
        await agent.stop()
        await kubelet.stop()
        shutil.rmtree(directory, ignore_errors=True)
    assert not agent.config.plugin_socket_path.exists()  # the agent removes its socket on the way out


async def test_refused_registration_is_retried_and_the_agent_keeps_running() -> None:
    async with rig() as r:
        bad = r.config.model_copy(update={"resource_name": "kubernetes.io/gpu"})
        await r.agent.stop()
        r.agent = Agent(bad, r.backend, ClusterPortAgent(r.cluster))
        await r.agent.start()
        await r.kubelet.restart()
        calls = r.backend.discover_calls
        # several watch rounds later: still not registered (kubelet refuses the name), still alive and probing
        while r.backend.discover_calls < calls + 2:
            await asyncio.sleep(0.02)
        assert r.agent.registrations == 0 and len(r.kubelet.registrations) == 1


class FlakyCluster(ClusterPortAgent):
    """The API server is unreachable while `down` (transport errors, not API answers)."""

    def __init__(self, port: MemoryCluster) -> None:
        super().__init__(port)
        self.down = True

    async def get_node(self, name: str) -> dict[str, object]:
        if self.down:
            raise ConnectionError("connection refused")
        return await super().get_node(name)

    async def list_pods_on_node(self, node: str) -> list[dict[str, object]]:
        if self.down:
            raise ConnectionError("connection refused")
        return await super().list_pods_on_node(node)


async def test_api_outage_does_not_stop_the_device_plugin() -> None:
    directory = Path(tempfile.mkdtemp(prefix="gpa-", dir="/tmp"))
    cluster = MemoryCluster()
    await cluster.create_node({"metadata": {"name": NODE}})
    flaky = FlakyCluster(cluster)
    kubelet = StandInKubelet(directory)
    await kubelet.start()
    agent = Agent(agent_config(directory), FakeBackend(four_gpus()), flaky)
    await agent.start()
    try:
        await kubelet.wait_for(lambda k: RESOURCE in k.plugins and len(k.healthy(RESOURCE)) == 16)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-0::0"])
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "connection refused" in err.value.details()
        assert "gpupool.io/inventory" not in (await cluster.get_node(NODE))["metadata"].get("annotations", {})
        flaky.down = False
        for _ in range(500):  # the inventory loop retries every inventory_interval_s; this only bounds the wait
            if "gpupool.io/inventory" in (await cluster.get_node(NODE))["metadata"].get("annotations", {}):
                break
            await asyncio.sleep(0.02)
        assert "gpupool.io/inventory" in (await cluster.get_node(NODE))["metadata"]["annotations"]
    finally:
        await agent.stop()
        await kubelet.stop()
        shutil.rmtree(directory, ignore_errors=True)
