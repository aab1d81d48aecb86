"""The node agent on a real control plane: it publishes its inventory to the real API server, registers
with a stand-in kubelet, the real kube-scheduler + extender bind share pods to its node, and for each bound
pod the kubelet stand-in calls Allocate (as kubelet does at pod admission). Each container must get
exactly the GPUs, memory and compute share written in its own pod's allocation."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.fake import FakeBackend, parse_fake_description
from gpupool.agent.devices.slots import slot_gpu
from gpupool.agent.identify import ANN_ALLOCATED
from gpupool.agent.port import ClusterPortAgent
from gpupool.agent.service import Agent
from gpupool.api.allocation import decode_allocation
from gpupool.api.names import ANN_ALLOCATION, ANN_INVENTORY, RESOURCE_GPU
from tests.e2e.conftest import Extender, Identities, kube_cluster
from tests.e2e.e2e_checks import allocation_problems, eventually
from tests.harness import fleet
from tests.harness import testbed as tb
from tests.harness.kubelet import StandInKubelet

pytestmark = pytest.mark.e2e
NS = "e2e-agent"
NODE = "e2e-agent-0"
GROUP = {"e2e/group": "agent"}
GPUS = {
    "driver_version": "570.86",
    "cuda_version": "12.8",
    "gpus": [
        {"uuid": f"GPU-e2e-agent-{i}", "model": "L40S", "memory_mib": 46068, "numa_node": i // 2} for i in range(4)
    ],
}


async def test_each_container_gets_exactly_its_own_allocation(
    testbed: tb.Testbed, api: fleet.KubeApi, extender: Extender, kube_scheduler: object, identities: Identities
) -> None:
    await api.ensure_namespace(NS)
    # The node as kubelet registers it, before the agent ran: no inventory, no GPU slots.
    await fleet.create_node(api, fleet.gpu_node(NODE, labels=GROUP, inventory=False))
    directory = Path(tempfile.mkdtemp(prefix="e2e-", dir="/tmp"))  # unix socket paths must stay short
    cluster = kube_cluster(identities.agent)  # the chart's agent account and rules
    (directory / "gpus.yaml").write_text(json.dumps(GPUS))
    config = AgentConfig(node_name=NODE, backend="fake", fake_file=directory / "gpus.yaml", split=10,
                         device_plugin_dir=directory, watch_interval_s=0.05, inventory_interval_s=5)
    kubelet = StandInKubelet(directory)
    agent = Agent(config, FakeBackend(parse_fake_description(GPUS, "e2e")), ClusterPortAgent(cluster))
    responses: dict[str, dict[str, str]] = {}
    devices: dict[str, list[str]] = {}
    try:
        await kubelet.start()
        await agent.start()
        await kubelet.wait_for(lambda k: len(k.healthy(RESOURCE_GPU)) == 40, timeout=30)
        # kubelet reports the plugin's healthy devices as the node's allocatable gpupool.io/gpu.
        slots = len(kubelet.healthy(RESOURCE_GPU))
        await api.patch(f"/api/v1/nodes/{NODE}/status", {"status": fleet.node_status(slots)})
        node = await api.get(f"/api/v1/nodes/{NODE}")
        assert ANN_INVENTORY in node["metadata"]["annotations"]  # published by the agent itself

        async def admit(pod: dict) -> None:
            """kubelet's pod admission: one Allocate per container asking for gpupool.io/gpu."""
            key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
            count = int(pod["spec"]["containers"][0]["resources"]["limits"][RESOURCE_GPU])
            reply = await kubelet.allocate(RESOURCE_GPU, key, count)
            responses[pod["metadata"]["name"]] = dict(reply.envs)
            devices[pod["metadata"]["name"]] = list(kubelet.assigned[key])

        # Two whole GPUs first (a share can only be asked for on one GPU), then five 1-GPU shares of 15 %.
        pods = [fleet.share_pod("pair", NS, memory_mib=None, cores=100, gpus=2, node_selector=GROUP)]
        pods += [fleet.share_pod(f"s{i}", NS, memory_mib=8192, cores=15, node_selector=GROUP) for i in range(5)]
        async with fleet.StatusKubelet(api, nodes={NODE}, hook=admit, namespace=NS) as status:
            await api.create_pod(pods[0])

            async def pair_running() -> bool:
                pod = await api.get(f"/api/v1/namespaces/{NS}/pods/pair")
                return pod["status"].get("phase") == "Running"

            await eventually(pair_running, timeout_s=120, what="the 2-GPU pod admitted")
            for p in pods[1:]:
                await api.create_pod(p)

            seen: list[dict] = []

            async def all_running() -> bool:
                seen[:] = (await api.list_pods(NS))[0]
                return len(seen) == len(pods) and all(p["status"].get("phase") == "Running" for p in seen)

            def state() -> str:
                pods_state = ", ".join(
                    f"{p['metadata']['name']}@{p['spec'].get('nodeName')}:{p['status'].get('phase')}:"
                    f"{[c.get('message') for c in p['status'].get('conditions') or []]}" for p in seen)
                stats = agent.service.stats if agent.service else None
                return f"{pods_state}; kubelet failures: {status.failures}; agent: {stats}"

            await eventually(all_running, timeout_s=120, what="every pod admitted and running", describe=state)
            assert status.failures == {}
        current, _ = await api.list_pods(NS)
        assert allocation_problems(current, [await api.get(f"/api/v1/nodes/{NODE}")]) == []
        for pod in current:
            name = pod["metadata"]["name"]
            doc = decode_allocation(pod["metadata"]["annotations"][ANN_ALLOCATION])
            env = responses[name]
            assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(g.uuid for g in doc.gpus)
            assert env["GPUPOOL_MEMORY_LIMIT_MIB"] == ",".join(str(g.memory_mib) for g in doc.gpus)
            assert env["GPUPOOL_CORES_PERCENT"] == ",".join(f"{g.cores:g}" for g in doc.gpus)
            assert env["GPUPOOL_ISOLATION"] == "hook"
            # kubelet's device IDs are slots of exactly the granted GPUs (GetPreferredAllocation steered it).
            assert sorted({slot_gpu(d) for d in devices[name]}) == sorted(g.uuid for g in doc.gpus)
            assert ANN_ALLOCATED in pod["metadata"]["annotations"]  # the agent recorded what it served
        all_ids = [d for ids in devices.values() for d in ids]
        assert len(all_ids) == len(set(all_ids)) == 7  # no slot handed out twice
        for pod in current:  # each marker (the scheduler's cue that the node is free again) names its own devices
            marker = json.loads(pod["metadata"]["annotations"][ANN_ALLOCATED])
            assert marker["devices"] == sorted(devices[pod["metadata"]["name"]])
        assert agent.service is not None and agent.service.stats.refused == 0
    finally:
        await agent.stop()
        await kubelet.stop()
        await cluster.close()
        shutil.rmtree(directory, ignore_errors=True)
