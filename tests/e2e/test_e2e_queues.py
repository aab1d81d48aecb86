"""Team queues on the real control plane: one queue floods a node borrowing the other's idle guarantee; the
other submits and gets its guarantee back by reclaim (evictions through the Eviction API, kube-scheduler
retrying the owner's pods), under the chart's RBAC."""

from __future__ import annotations

import time

import pytest

from gpupool.api.queue import LABEL_QUEUE
from gpupool.cluster.kube import KubeCluster
from gpupool.cluster.port import EVENTS
from gpupool.scheduler.queues import GPUQUEUES
from gpupool.testing import fleet
from tests.e2e.conftest import Extender
from tests.e2e.e2e_checks import eventually

pytestmark = pytest.mark.e2e
QUEUES = ("e2e-qa", "e2e-qb")


def _whole(name: str, ns: str, selector: dict[str, str]) -> dict:
    return fleet.share_pod(name, ns, memory_mib=None, cores=100, gpus=1, node_selector=selector)


async def _bound(api: fleet.KubeApi, ns: str) -> list[str]:
    pods, _ = await api.list_pods(ns)
    return sorted(p["metadata"]["name"] for p in pods
                  if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp"))


async def test_the_owner_gets_its_guarantee_back_from_a_flooding_queue(
    api: fleet.KubeApi, kube: KubeCluster, extender: Extender, kube_scheduler: object
) -> None:
    group = {"e2e/group": "queues"}
    node = fleet.gpu_node("e2e-queues-0", gpus=4, labels=group)
    await fleet.create_nodes(api, [node])
    for q in QUEUES:
        await api.ensure_namespace(q, labels={LABEL_QUEUE: q})
        # Each queue is guaranteed two GPUs (GPUs only: memory and cores are not counted).
        await kube.create_object(GPUQUEUES, {"apiVersion": "gpupool.io/v1alpha1", "kind": "GPUQueue",
                                             "metadata": {"name": q}, "spec": {"guaranteed": {"gpus": "2"}}})
    try:
        await eventually(lambda: set(QUEUES) <= set(extender.ledger()["queues"]["queues"]), timeout_s=60,
                         what="the extender sees both queues")
        async with fleet.StatusKubelet(api, nodes={node["metadata"]["name"]}):
            # e2e-qa floods the node: 4 GPUs, two of them e2e-qb's idle guarantee.
            for i in range(4):
                await api.create_pod(_whole(f"flood-{i}", "e2e-qa", group))

            async def flooded() -> bool:
                return len(await _bound(api, "e2e-qa")) == 4

            await eventually(flooded, timeout_s=120, what="the flood bound")
            submitted = time.monotonic()
            for i in range(2):
                await api.create_pod(_whole(f"owner-{i}", "e2e-qb", group))

            async def reclaimed() -> bool:
                return await _bound(api, "e2e-qb") == ["owner-0", "owner-1"]

            await eventually(reclaimed, timeout_s=120, what="the owner's pods bound")
            took = time.monotonic() - submitted
        # e2e-qa keeps exactly its guarantee; the two borrowed pods were evicted, and said so.
        assert len(await _bound(api, "e2e-qa")) == 2
        events, _ = await kube.list_objects(EVENTS, namespace="e2e-qa")
        preempted = [e for e in events if e["reason"] == "Preempted"]
        assert len(preempted) == 2 and all("reclaimed for queue e2e-qb" in e["message"] for e in preempted)
        assert extender.ledger()["diff"] == {"missing": [], "extra": [], "different": [], "overcommitted": []}

        # The leading scheduler writes each queue's status: e2e-qa back at its guarantee, nothing borrowed.
        async def status_written() -> bool:
            status = (await kube.get_object(GPUQUEUES, "e2e-qa")).get("status") or {}
            return status.get("usage", {}).get("gpus") == "2" and status.get("borrowed", {}).get("gpus") == "0"

        await eventually(status_written, timeout_s=30, what="the GPUQueue status")
        print(f"reclaim: owner's 2 pods bound {took:.1f} s after submit")
    finally:
        for q in QUEUES:
            await kube.delete_object(GPUQUEUES, q)
            pods, _ = await api.list_pods(q)
            for p in pods:
                await kube.delete_pod(q, p["metadata"]["name"])
