"""Team queues on the real control plane: one queue floods a node borrowing the other's idle guarantee; the
other submits and gets its guarantee back by reclaim (evictions through the Eviction API, kube-scheduler
retrying the owner's pods), under the chart's RBAC."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from gpupool.api.queue import LABEL_QUEUE
from gpupool.cluster.kube import KubeCluster
from gpupool.cluster.port import EVENTS, PDBS
from gpupool.scheduler.queues import GPUQUEUES
from tests.e2e.conftest import Extender
from tests.e2e.e2e_checks import eventually
from tests.harness import fleet

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


async def test_priority_preemption_in_a_queue_moves_past_a_pod_its_budget_protects(
    api: fleet.KubeApi, kube: KubeCluster, extender: Extender, kube_scheduler: object
) -> None:
    group, ns = {"e2e/group": "priority"}, "e2e-qp"
    node = fleet.gpu_node("e2e-priority-0", gpus=2, labels=group)
    await fleet.create_nodes(api, [node])
    await api.ensure_namespace(ns, labels={LABEL_QUEUE: ns})
    with contextlib.suppress(fleet.ApiStatus):  # one PriorityClass for the session
        await api.post("/apis/scheduling.k8s.io/v1/priorityclasses", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "e2e-high"},
            "value": 1000})
    await kube.create_object(GPUQUEUES, {"apiVersion": "gpupool.io/v1alpha1", "kind": "GPUQueue",
                                         "metadata": {"name": ns}, "spec": {"guaranteed": {"gpus": "2"}}})
    try:
        await eventually(lambda: ns in extender.ledger()["queues"]["queues"], timeout_s=60, what="the queue")
        async with fleet.StatusKubelet(api, nodes={node["metadata"]["name"]}):
            # `older` starts first; `guarded` (newer: less run time lost, so the first choice) has a budget
            # that allows no disruption.
            for name, labels in (("older", {}), ("guarded", {"app": "guarded"})):
                pod = _whole(name, ns, group)
                pod["metadata"]["labels"] = labels
                await api.create_pod(pod)

                async def running(name: str = name) -> bool:
                    pods, _ = await api.list_pods(ns)
                    return any(p["metadata"]["name"] == name and p["status"].get("phase") == "Running" for p in pods)

                await eventually(running, timeout_s=60, what=f"{name} running")
                # Start times have one-second resolution: keep `guarded` strictly the newer of the two.
                await asyncio.sleep(1.1)
            await kube.create_object(PDBS, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                            "metadata": {"name": "guard", "namespace": ns},
                                            "spec": {"minAvailable": 1,
                                                     "selector": {"matchLabels": {"app": "guarded"}}}})

            async def budget_current() -> bool:  # the disruption controller's status: nothing may go
                pdb = await kube.get_object(PDBS, "guard", ns)
                status = pdb.get("status") or {}
                return bool(status.get("observedGeneration") == pdb["metadata"].get("generation")
                            and status.get("currentHealthy") == 1 and status.get("disruptionsAllowed") == 0)

            await eventually(budget_current, timeout_s=60, what="the budget's status")
            high = _whole("high", ns, group)
            high["spec"]["priorityClassName"] = "e2e-high"
            await api.create_pod(high)

            async def high_bound() -> bool:
                return "high" in await _bound(api, ns)

            await eventually(high_bound, timeout_s=120, what="the high-priority pod bound")
        assert await _bound(api, ns) == ["guarded", "high"]  # the budget kept `guarded`; `older` made room
        events, _ = await kube.list_objects(EVENTS, namespace=ns)
        reasons = {(e["involvedObject"]["name"], e["reason"]) for e in events}
        assert ("guarded", "PreemptionBlocked") in reasons and ("older", "Preempted") in reasons
    finally:
        await kube.delete_object(GPUQUEUES, ns)
        pods, _ = await api.list_pods(ns)
        for p in pods:
            await kube.delete_pod(ns, p["metadata"]["name"])
