"""The webhook's view of the cluster's GPUs: summarised from node inventories, kept current by a watch."""

from __future__ import annotations

import asyncio
import json

from gpupool.api.names import ANN_INVENTORY
from gpupool.cluster.memory import MemoryCluster
from gpupool.webhook.inventory import InventoryView, follow
from tests.webhook.helpers import gpu_node


def test_summary_per_model_and_node() -> None:
    view = InventoryView()
    assert view.limits is None and not view.synced
    view.replace(
        [gpu_node("a", "A100-40GB", 40960, 2), gpu_node("b", "H100-80GB", 81920, 4), {"metadata": {"name": "cpu"}}]
    )
    assert view.synced and view.limits is not None
    assert view.limits.largest_memory_mib == 81920
    assert dict(view.limits.largest_by_model) == {"A100-40GB": 40960, "H100-80GB": 81920}
    assert view.limits.most_gpus_on_a_node == 4
    view.delete({"metadata": {"name": "b"}})
    assert view.limits.largest_memory_mib == 40960 and view.limits.most_gpus_on_a_node == 2
    view.delete({"metadata": {"name": "a"}})
    assert view.limits is None  # no GPU node left: nothing to check against


def test_broken_inventory_is_ignored_not_fatal() -> None:
    view = InventoryView()
    broken = {"metadata": {"name": "x", "annotations": {ANN_INVENTORY: json.dumps({"version": 1, "gpus": "no"})}}}
    view.replace([broken, gpu_node("a", "A10", 23028, 1)])
    assert view.limits is not None and dict(view.limits.largest_by_model) == {"A10": 23028}


def test_heartbeat_does_not_resummarise() -> None:
    view = InventoryView()
    node = gpu_node("a", "A10", 23028, 1)
    view.replace([node])
    before = view.limits
    heartbeat = json.loads(json.dumps(node))
    heartbeat["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    view.upsert(heartbeat)
    assert view.limits is before  # same object: the summary was not rebuilt


async def test_follow_keeps_the_view_current() -> None:
    cluster = MemoryCluster()
    await cluster.create_node(gpu_node("a", "A10", 23028, 2))
    view = InventoryView()
    task = asyncio.create_task(follow(cluster, view))

    async def until(check: object) -> None:
        for _ in range(500):  # generous bound only to avoid a hang
            if callable(check) and check():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("view not updated")

    try:
        await until(lambda: view.limits is not None and view.limits.largest_memory_mib == 23028)
        await cluster.create_node(gpu_node("b", "H100-80GB", 81920, 8))
        await until(lambda: view.limits is not None and view.limits.most_gpus_on_a_node == 8)
        smaller = gpu_node("b", "H100-80GB", 81920, 1)
        await cluster.patch_node_annotations("b", {ANN_INVENTORY: smaller["metadata"]["annotations"][ANN_INVENTORY]})
        await until(lambda: view.limits is not None and view.limits.most_gpus_on_a_node == 2)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
