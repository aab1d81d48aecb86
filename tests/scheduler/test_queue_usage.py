"""QueueCache.usage is kept incrementally from the ledger's changes; under any sequence of ledger changes
(binds in flight, confirmations, releases, node rebuilds) and namespace relabelling it equals a recount from
scratch, with and without pods left out."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.api.queue import LABEL_QUEUE
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import CRDS, NAMESPACES
from gpupool.core.model import Allocation, GPUGrant, GPURequest, PodRequest
from gpupool.core.queues import ZERO, charge_of_allocation
from gpupool.demo.embedded import node_objects
from gpupool.scheduler.ledger import Ledger
from gpupool.scheduler.queues import GPUQUEUES, QueueCache
from tests.scheduler.conftest import eventually, small_scenario

CRD = Path(__file__).resolve().parents[2] / "deploy/helm/gpupool/crds/gpuqueues.yaml"
NAMESPACES_USED = ("ns-0", "ns-1", "ns-2")
QUEUES = ("q-a", "q-b")  # and "nowhere", a label naming no queue (its pods are counted under that name)

Op = tuple[str, int, int, int, int]
ops = st.lists(st.tuples(st.sampled_from(["assume", "assume", "assume", "release", "relabel", "rebuild"]),
                         st.integers(0, 11), st.integers(0, 2), st.integers(0, 3), st.integers(1, 10)),
               max_size=30)


async def scenario(sequence: list[Op]) -> None:
    cluster = MemoryCluster()
    nodes = node_objects(small_scenario(nodes=2, gpus=2))
    for obj in nodes:
        await cluster.create_node(obj)
    await cluster.create_object(CRDS, yaml.safe_load(CRD.read_text()))
    for q in QUEUES:
        await cluster.create_object(GPUQUEUES, {"metadata": {"name": q}, "spec": {"guaranteed": {"gpus": "1"}}})
    for ns in NAMESPACES_USED:
        await cluster.create_object(NAMESPACES, {"metadata": {"name": ns, "labels": {LABEL_QUEUE: "q-a"}}})
    ledger = Ledger(nodes)
    cache = QueueCache(cluster, ledger)
    await cache.start()
    try:
        await eventually(lambda: cache.enabled and set(QUEUES) <= set(cache.queues.tree.specs)
                         and all(cache.queue_of(ns) == "q-a" for ns in NAMESPACES_USED))
        assert cache.usage() == cache.recount() == {}
        for kind, pod, ns, where, tenths in sequence:
            uid = f"uid-{pod}"
            if kind == "assume":
                ledger.release(uid)  # the same pod placed again (its allocation replaced)
                node = ledger.state.nodes[where // 2]
                gpu = node.gpus[where % 2]
                milli, memory = tenths * 100, tenths * 1024
                request = PodRequest(uid, gpu=GPURequest(count=1, milli=milli, memory_mib=memory))
                grant = GPUGrant(gpu.uuid, where % 2, milli, memory)
                ledger.assume(uid, f"{NAMESPACES_USED[ns]}/p{pod}", request, Allocation(uid, node.name, (grant,)),
                              deadline=1e9)
            elif kind == "release":
                ledger.release(uid)
            elif kind == "relabel":
                queue = (*QUEUES, "nowhere")[where % 3]
                await cluster.patch_object(NAMESPACES, NAMESPACES_USED[ns], {"metadata": {"labels": {
                    LABEL_QUEUE: queue}}})
                await eventually(lambda ns=ns, queue=queue: cache.queue_of(NAMESPACES_USED[ns]) == queue)
            else:
                ledger.replace_nodes(list(ledger.node_objs.values()))
            truth = cache.recount()
            assert _nonzero(cache.usage()) == _nonzero(truth)
            # Left out: the pod being decided and pods being evicted, as a recount without them.
            left_out = {f"uid-{pod}", f"uid-{(pod + 1) % 12}"}
            expected_without = dict(truth)
            for u in left_out:
                entry = ledger.entries.get(u)
                if entry is not None:
                    q = cache.queue_of(entry.key.split("/")[0])
                    charge = charge_of_allocation(entry.allocation, cache.gpu_memory())
                    expected_without[q] = expected_without[q] - charge
            assert _nonzero(cache.usage(without=f"uid-{pod}", gone={f"uid-{(pod + 1) % 12}"})) == _nonzero(
                expected_without)
    finally:
        await cache.stop()


def _nonzero(usage: dict) -> dict:  # type: ignore[type-arg]
    return {q: u for q, u in usage.items() if not u.is_zero()}


@settings(max_examples=40, deadline=None)
@given(ops)
def test_incremental_usage_equals_a_recount_from_scratch(sequence: list[Op]) -> None:
    asyncio.run(scenario(sequence))


async def test_a_dra_claim_counts_against_its_namespaces_queue() -> None:
    """A claim on gpupool's devices is charged to the queue of its namespace, as a pod there would be."""
    from gpupool.api.dra import DRIVER

    cluster = MemoryCluster()
    nodes = node_objects(small_scenario(nodes=2, gpus=2))
    await cluster.create_object(CRDS, yaml.safe_load(CRD.read_text()))
    await cluster.create_object(GPUQUEUES, {"metadata": {"name": "q-a"}, "spec": {"guaranteed": {"gpus": "1"}}})
    await cluster.create_object(NAMESPACES, {"metadata": {"name": "ns-0", "labels": {LABEL_QUEUE: "q-a"}}})
    ledger = Ledger(nodes)
    cache = QueueCache(cluster, ledger)
    await cache.start()
    try:
        await eventually(lambda: cache.enabled and cache.queue_of("ns-0") == "q-a")
        node = ledger.state.nodes[0]
        ledger.apply_claim("ADDED", {
            "metadata": {"name": "c", "namespace": "ns-0", "uid": "claim-1"},
            "status": {"allocation": {"devices": {"results": [{
                "request": "gpu", "driver": DRIVER, "pool": node.name, "device": "gpu-1",
                "consumedCapacity": {"memory": "4Gi", "cores": "30"}}]}}}})
        # 30 % of one GPU = 300 milli, and its 4096 MiB, charged to q-a
        expected = charge_of_allocation(Allocation("claim-1", node.name, (GPUGrant(node.gpus[1].uuid, 1, 300, 4096),)),
                                        cache.gpu_memory())
        assert cache.usage() == cache.recount() == {"q-a": expected}
        assert expected.gpu_milli == 300
        ledger.apply_claim("DELETED", {"metadata": {"name": "c", "namespace": "ns-0", "uid": "claim-1"}})
        assert cache.usage().get("q-a", ZERO) == ZERO and cache.recount() == {}
    finally:
        await cache.stop()
