"""The Eviction API as the cluster port offers it, checked the same way on the embedded cluster and on the
real API server (tests/e2e): a pod no budget covers is evicted; a budget with no disruption left refuses
with 429 and keeps the pod; a budget that allows one lets one through, then refuses; a stale UID is a
conflict.

On the embedded cluster the test writes each budget's status itself; on the real API server the
disruption controller of kube-controller-manager writes it (`controller=True`), from the pods it sees."""

from __future__ import annotations

import asyncio

import pytest

from gpupool.cluster.port import PDBS, ClusterPort, Conflict, NotFound, TooManyRequests


def _pod(name: str, namespace: str, labels: dict[str, str]) -> dict:  # type: ignore[type-arg]
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"schedulerName": "nobody", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "registry.invalid/none"}]}}


async def _budget(cluster: ClusterPort, namespace: str, name: str, app: str, healthy: int,
                  controller: bool) -> None:
    """minAvailable 1 over `healthy` running, ready pods: `healthy - 1` disruptions allowed."""
    await cluster.create_object(PDBS, {
        "apiVersion": PDBS.api_version, "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
    })
    status = {"disruptionsAllowed": healthy - 1, "currentHealthy": healthy, "desiredHealthy": 1,
              "expectedPods": healthy}
    if not controller:  # what the disruption controller would write
        current = await cluster.get_object(PDBS, name, namespace)
        await cluster.patch_object(PDBS, name, {"status": {
            **status, "observedGeneration": current["metadata"].get("generation", 1),
        }}, namespace=namespace, subresource="status")
        return
    # The API server refuses evictions under a budget whose status is older than its spec: wait for the
    # controller's first status, and check it says what the arithmetic above says.
    for _ in range(300):
        got = await cluster.get_object(PDBS, name, namespace)
        seen = got.get("status") or {}
        if seen.get("observedGeneration") == got["metadata"].get("generation"):
            assert {k: seen.get(k) for k in status} == status
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the disruption controller wrote no status for budget {name}: {got}")


async def _running(cluster: ClusterPort, namespace: str, name: str, labels: dict[str, str]) -> str:
    """A running, ready pod (the API server checks budgets only for running pods, and lets a pod that is not
    ready go while the budget has its healthy pods); its UID."""
    pod = await cluster.create_pod(_pod(name, namespace, labels))
    await cluster.patch_pod_status(namespace, name, {"phase": "Running",
                                                     "conditions": [{"type": "Ready", "status": "True"}]})
    return str(pod["metadata"]["uid"])


async def check_eviction(cluster: ClusterPort, namespace: str, controller: bool = False) -> None:
    """`controller`: a disruption controller keeps the budgets' status (a real cluster)."""
    # Running: for a pending pod the API server retries a failed precondition for 10 s before answering.
    free = await _running(cluster, namespace, "free", {"app": "free"})
    with pytest.raises(Conflict):
        await cluster.evict_pod(namespace, "free", "not-its-uid")
    await cluster.evict_pod(namespace, "free", free)
    with pytest.raises(NotFound):
        await cluster.get_pod(namespace, "free")

    guarded = await _running(cluster, namespace, "guarded", {"app": "guarded"})
    await _budget(cluster, namespace, "guarded", "guarded", healthy=1, controller=controller)
    with pytest.raises(TooManyRequests):
        await cluster.evict_pod(namespace, "guarded", guarded)
    assert (await cluster.get_pod(namespace, "guarded"))["metadata"]["uid"] == guarded
    # A pending pod under the same budget is not protected by it.
    pending = await cluster.create_pod(_pod("guarded-pending", namespace, {"app": "guarded"}))
    await cluster.evict_pod(namespace, "guarded-pending", pending["metadata"]["uid"])

    first = await _running(cluster, namespace, "one-a", {"app": "one"})
    second = await _running(cluster, namespace, "one-b", {"app": "one"})
    await _budget(cluster, namespace, "one", "one", healthy=2, controller=controller)
    await cluster.evict_pod(namespace, "one-a", first)
    with pytest.raises(NotFound):
        await cluster.get_pod(namespace, "one-a")
    with pytest.raises(TooManyRequests):  # the one disruption it allowed is spent
        await cluster.evict_pod(namespace, "one-b", second)
