"""Shares per GPU: a GPU takes at most its node's `split` pods (the inventory's device-plugin slots per GPU),
and at most 48 MPS clients; the reason shows in filter answers and in the pending message."""

from __future__ import annotations

import asyncio

from gpupool.api.extender import ExtenderArgs
from gpupool.api.inventory import encode_inventory
from gpupool.api.node_objects import nodes_from_objects
from gpupool.api.recompute import recompute
from gpupool.cluster.memory import MemoryCluster
from gpupool.core.model import GPU
from gpupool.demo.embedded import SPLIT, PodShape, Scenario, Workload, load_scenario, start_embedded, workload_pods
from gpupool.demo.kube_scheduler import KubeSchedulerDriver
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.service import ExtenderService
from tests.scheduler.conftest import bind_args, gpu_pod, started_service


def pods_per_gpu(nodes: list[dict], pods: list[dict]) -> dict[str, int]:
    """GPU uuid -> pods holding a share of it, from API objects only."""
    count = {g.uuid: 0 for n in nodes_from_objects(nodes)[0] for g in n.gpus}
    for c in recompute(nodes, pods).allocations.values():
        for g in c.allocation.grants:
            count[g.uuid] += 1
    return count


async def _bind_running(svc: ExtenderService, pod: dict, node: str = "gpu-0000") -> str:
    error = (await svc.bind(bind_args(pod, node))).Error
    if not error:  # its Allocate happened: the node's lock is free for the next pod
        await svc.cluster.patch_pod_status("default", pod["metadata"]["name"], {"phase": "Running"})
    return error


async def test_a_gpu_takes_at_most_split_pods_and_says_why():
    svc = await started_service(nodes=1, gpus=1)  # one 16 GiB GPU; inventory split = SPLIT = 10
    cluster = svc.cluster
    # Memory-only shares take 1/1000 of the compute each: by compute and memory, 16 of them would fit.
    pods = [await cluster.create_pod(gpu_pod(f"m{i}", cores=None, memory=1024)) for i in range(SPLIT + 1)]
    for pod in pods[:SPLIT]:
        assert await _bind_running(svc, pod) == ""
    extra = pods[SPLIT]
    answer = await svc.filter(ExtenderArgs(Pod=extra, NodeNames=["gpu-0000"]))
    assert answer.NodeNames == []
    why = answer.FailedNodes["gpu-0000"]
    assert why == ("needs 1 x a GPU with 0.1 percent compute and 1024 MiB free; 0 available (GPU 0 already shared "
                   "by 10 pods each, the limit of this node (inventory split 10))")
    assert svc.pending["default/m10"][0] == f"fits no node, e.g. {why}"
    error = await _bind_running(svc, extra)
    assert "inventory split 10" in error
    nodes, _ = await cluster.list_nodes()
    api_pods, _ = await cluster.list_pods()
    assert max(pods_per_gpu(nodes, api_pods).values()) == SPLIT
    # One leaves: the GPU takes the next pod again.
    await cluster.delete_pod("default", "m0")
    for _ in range(200):
        if int(svc.ledger.sharers.max()) < SPLIT:
            break
        await asyncio.sleep(0.01)
    assert (await svc.filter(ExtenderArgs(Pod=extra, NodeNames=["gpu-0000"]))).NodeNames == ["gpu-0000"]
    assert await _bind_running(svc, extra) == ""
    await svc.stop()


async def test_a_full_gpu_is_passed_over_for_another_on_the_same_node():
    svc = await started_service(nodes=1, gpus=2)
    cluster = svc.cluster
    pods = [await cluster.create_pod(gpu_pod(f"m{i}", cores=None, memory=512)) for i in range(SPLIT + 3)]
    for pod in pods:
        assert await _bind_running(svc, pod) == ""
    nodes, _ = await cluster.list_nodes()
    api_pods, _ = await cluster.list_pods()
    assert sorted(pods_per_gpu(nodes, api_pods).values()) == [3, SPLIT]  # 13 pods: 10 + 3, not 13 on one
    assert (await svc.debug_ledger())["diff"]["overcommitted"] == []
    await svc.stop()


async def test_mps_clients_are_held_to_48_per_gpu():
    """A node that promises 64 pods per GPU still gets at most 48 MPS clients on one; other pods go on."""
    cluster = MemoryCluster()
    gpu = GPU(uuid="GPU-big-0", index=0, model="H100-80GB", memory_mib=81920)
    inventory = encode_inventory("big", [gpu], 64, extra={0: {"mps": "up"}})  # MPS shares need its daemon
    await cluster.create_node({
        "metadata": {"name": "big", "annotations": {"gpupool.io/inventory": inventory}},
        "status": {"allocatable": {"cpu": "1000", "memory": "4096Gi"}},
    })
    svc = ExtenderService(cluster, SchedulerConfig(leader_elect=False))
    await svc.start()
    mps = {"gpupool.io/isolation": "mps"}
    for i in range(48):
        pod = await cluster.create_pod(gpu_pod(f"c{i}", cores=None, memory=256, annotations=mps))
        assert await _bind_running(svc, pod, "big") == ""
    client = await cluster.create_pod(gpu_pod("c48", cores=None, memory=256, annotations=mps))
    answer = await svc.filter(ExtenderArgs(Pod=client, NodeNames=["big"]))
    assert answer.NodeNames == []
    assert "48 MPS clients per GPU" in answer.FailedNodes["big"]
    plain = await cluster.create_pod(gpu_pod("hooked", cores=None, memory=256))
    assert (await svc.filter(ExtenderArgs(Pod=plain, NodeNames=["big"]))).NodeNames == ["big"]
    assert await _bind_running(svc, plain, "big") == ""
    await svc.stop()


async def test_the_demo_never_puts_more_than_split_pods_on_one_gpu():
    """`gpupool demo --nodes 60`: the default scenario, scaled, through the fake kube-scheduler over HTTP.
    Before the shares_per_gpu plugin, memory-only shares piled up (35 pods on one A100 with split 10)."""
    scenario = load_scenario().scaled(60)
    emb = await start_embedded(scenario, SchedulerConfig(port=0, leader_elect=False))
    driver = KubeSchedulerDriver(emb.url, emb.cluster, emb.node_names, seed=scenario.seed)
    try:
        stats = await driver.run(workload_pods(scenario))
        assert stats.bound > 0  # what it checks is placement; how fast it runs is benchmarks/extender_latency.py's
        nodes, _ = await emb.cluster.list_nodes()
        pods, _ = await emb.cluster.list_pods()
        counts = pods_per_gpu(nodes, pods)
        assert max(counts.values()) <= SPLIT
        assert any(c == SPLIT for c in counts.values())  # the limit was reached, so it was tested
        assert (await emb.service.debug_ledger())["diff"]["overcommitted"] == []
    finally:
        await driver.close()
        await emb.stop()


async def test_memory_only_pods_fill_every_gpu_to_split_and_no_further():
    """A workload of memory-only shares only: 4 one-GPU nodes take exactly 4 x SPLIT pods."""
    scenario = Scenario(
        name="memory-only",
        nodes=[{"prefix": "gpu", "count": 4, "model": "A10-24GB", "gpus": 1, "gpu_memory_mib": 23028}],
        workload=Workload(pods=4 * SPLIT + 5, namespace="demo", mix=[PodShape(weight=1, gpu=1, memory_mib=256)]),
    )
    emb = await start_embedded(scenario, SchedulerConfig(port=0, leader_elect=False))
    driver = KubeSchedulerDriver(emb.url, emb.cluster, emb.node_names)
    try:
        stats = await driver.run(workload_pods(scenario))
        assert stats.bound == 4 * SPLIT and stats.unschedulable == 5
        assert all("inventory split 10" in o.reason for o in stats.outcomes if o.node is None)
        nodes, _ = await emb.cluster.list_nodes()
        pods, _ = await emb.cluster.list_pods()
        assert sorted(pods_per_gpu(nodes, pods).values()) == [SPLIT] * 4
    finally:
        await driver.close()
        await emb.stop()
