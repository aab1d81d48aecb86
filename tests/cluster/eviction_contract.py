"""The Eviction API as the cluster port offers it, checked the same way on the embedded cluster and on the
real API server (tests/e2e): a pod no budget covers is evicted; a budget with no disruption left refuses
with 429 and keeps the pod; a budget that allows one lets one through, then refuses; a stale UID is a
conflict."""

from __future__ import annotations

import pytest

from gpupool.cluster.port import PDBS, ClusterPort, Conflict, Kind, NotFound, TooManyRequests


def _pod(name: str, namespace: str, labels: dict[str, str]) -> dict:  # type: ignore[type-arg]
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"schedulerName": "nobody", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "registry.invalid/none"}]}}


async def _budget(cluster: ClusterPort, kind: Kind, namespace: str, name: str, app: str, allowed: int) -> None:
    await cluster.create_object(kind, {
        "apiVersion": kind.api_version, "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
    })
    # What the disruption controller would write (the testbed runs no controller manager).
    current = await cluster.get_object(kind, name, namespace)
    await cluster.patch_object(kind, name, {"status": {
        "disruptionsAllowed": allowed, "currentHealthy": 2, "desiredHealthy": 1, "expectedPods": 2,
        "observedGeneration": current["metadata"].get("generation", 1),
    }}, namespace=namespace, subresource="status")


async def _running(cluster: ClusterPort, namespace: str, name: str, labels: dict[str, str]) -> str:
    """A running, ready pod (the API server checks budgets only for running pods, and lets a pod that is not
    ready go while the budget has its healthy pods); its UID."""
    pod = await cluster.create_pod(_pod(name, namespace, labels))
    await cluster.patch_pod_status(namespace, name, {"phase": "Running",
                                                     "conditions": [{"type": "Ready", "status": "True"}]})
    return str(pod["metadata"]["uid"])


async def check_eviction(cluster: ClusterPort, namespace: str, pdb_kind: Kind = PDBS) -> None:
    """`pdb_kind`: policy/v1 by default; Kubernetes 1.20 (the testbed) serves only policy/v1beta1."""
    # Running: for a pending pod the API server retries a failed precondition for 10 s before answering.
    free = await _running(cluster, namespace, "free", {"app": "free"})
    with pytest.raises(Conflict):
        await cluster.evict_pod(namespace, "free", "not-its-uid")
    await cluster.evict_pod(namespace, "free", free)
    with pytest.raises(NotFound):
        await cluster.get_pod(namespace, "free")

    await _budget(cluster, pdb_kind, namespace, "guarded", "guarded", allowed=0)
    guarded = await _running(cluster, namespace, "guarded", {"app": "guarded"})
    with pytest.raises(TooManyRequests):
        await cluster.evict_pod(namespace, "guarded", guarded)
    assert (await cluster.get_pod(namespace, "guarded"))["metadata"]["uid"] == guarded
    # A pending pod under the same budget is not protected by it.
    pending = await cluster.create_pod(_pod("guarded-pending", namespace, {"app": "guarded"}))
    await cluster.evict_pod(namespace, "guarded-pending", pending["metadata"]["uid"])

    await _budget(cluster, pdb_kind, namespace, "one", "one", allowed=1)
    first = await _running(cluster, namespace, "one-a", {"app": "one"})
    await cluster.evict_pod(namespace, "one-a", first)
    with pytest.raises(NotFound):
        await cluster.get_pod(namespace, "one-a")
    second = await _running(cluster, namespace, "one-b", {"app": "one"})
    with pytest.raises(TooManyRequests):  # the one disruption it allowed is spent
        await cluster.evict_pod(namespace, "one-b", second)
