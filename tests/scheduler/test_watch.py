"""The scheduler's watch loops (gpupool.scheduler.watch) against the embedded cluster's real watch streams."""

from __future__ import annotations

import asyncio

from gpupool.api.extender import ExtenderArgs
from gpupool.demo.embedded import node_objects
from tests.scheduler.conftest import eventually, gpu_pod, small_scenario, started_service


async def test_a_burst_of_new_nodes_is_rebuilt_once_per_delivery_not_once_per_node() -> None:
    svc = await started_service(nodes=2, gpus=2)
    try:
        generation = svc.ledger.generation
        fresh = node_objects(small_scenario(nodes=14, gpus=2))[2:]  # gpu-0002 .. gpu-0013
        await asyncio.gather(*(svc.cluster.create_node(n) for n in fresh))
        await eventually(lambda: len(svc.ledger.state) == 14 and not svc.ledger.stale)
        rebuilds = svc.ledger.generation - generation
        assert 1 <= rebuilds < len(fresh), rebuilds
        assert sorted(svc.ledger.state.index) == [f"gpu-{i:04d}" for i in range(14)]
    finally:
        await svc.stop()


async def test_a_filter_sees_a_node_change_the_watch_delivered_before_it() -> None:
    svc = await started_service(nodes=1, gpus=2)
    try:
        new = node_objects(small_scenario(nodes=2, gpus=2))[1]
        # The node event applied with its rebuild still due (as the watch does): the next cycle rebuilds first.
        svc.ledger.apply_node("ADDED", new, rebuild=False)
        assert "gpu-0001" not in svc.ledger.state.index
        pod = await svc.cluster.create_pod(gpu_pod("p", cores=50))
        await eventually(lambda: svc.pods.get(pod["metadata"]["uid"]) is not None)
        answer = await svc.filter(ExtenderArgs(Pod=pod, NodeNames=["gpu-0001"]))
        assert answer.NodeNames == ["gpu-0001"] and not svc.ledger.stale
    finally:
        await svc.stop()
