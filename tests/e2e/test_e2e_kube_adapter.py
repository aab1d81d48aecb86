"""The `kube` cluster adapter against the real API server: list/watch, optimistic concurrency (409 on a
stale resourceVersion), Binding rules and Lease-based leader election."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

import pytest

from gpupool.cluster.kube import KubeCluster
from gpupool.cluster.port import Conflict, NotFound, WatchEvent
from gpupool.scheduler.leader import LeaderElector
from tests.e2e.conftest import kube_cluster
from tests.e2e.e2e_checks import eventually
from tests.harness import fleet

pytestmark = pytest.mark.e2e
NS = "e2e-adapter"
_n = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_n)}"


async def _collect(stream, events: list[WatchEvent], stop: asyncio.Event) -> None:  # type: ignore[no-untyped-def]
    async for e in stream:
        events.append(e)
        if stop.is_set():
            return


async def test_list_then_watch_sees_every_change_in_order(kube: KubeCluster, api: fleet.KubeApi) -> None:
    await api.ensure_namespace(NS)
    name = unique("watched")
    created = await kube.create_pod(fleet.plain_pod(name, NS, scheduler="e2e-nobody"))
    pods, rv = await kube.list_pods()
    assert name in {p["metadata"]["name"] for p in pods}
    events: list[WatchEvent] = []
    stop = asyncio.Event()
    task = asyncio.create_task(_collect(kube.watch_pods(rv), events, stop))
    try:
        await kube.patch_pod_annotations(NS, name, {"e2e/step": "1"})
        await kube.patch_pod_annotations(NS, name, {"e2e/step": "2"})
        await kube.delete_pod(NS, name, uid=created["metadata"]["uid"])

        def seen() -> list[str] | None:
            mine = [e for e in events if e.object["metadata"]["name"] == name]
            got = [f"{e.type}:{(e.object['metadata'].get('annotations') or {}).get('e2e/step', '-')}" for e in mine]
            return got if got and got[-1].startswith("DELETED") else None

        # The pod has terminationGracePeriodSeconds 0 and no kubelet: deletion is immediate.
        got = await eventually(seen, what="DELETED event")
        # (Deleting may first show the deletionTimestamp as one more MODIFIED.)
        assert got[:2] == ["MODIFIED:1", "MODIFIED:2"] and got[-1] == "DELETED:2"
        assert set(got[2:-1]) <= {"MODIFIED:2"}
    finally:
        stop.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_node_watch_and_list(kube: KubeCluster, api: fleet.KubeApi) -> None:
    name = unique("e2e-adapter-node")
    _, rv = await kube.list_nodes()
    events: list[WatchEvent] = []
    stop = asyncio.Event()
    task = asyncio.create_task(_collect(kube.watch_nodes(rv), events, stop))
    try:
        await fleet.create_node(api, fleet.gpu_node(name, gpus=2))
        node = await kube.get_node(name)
        assert node["status"]["allocatable"]["gpupool.io/gpu"] == "20"  # 2 GPUs x 10 slots, as written
        await kube.patch_node_annotations(name, {"e2e/seen": "yes"})

        def mine() -> list[str] | None:
            got = [e.type for e in events if e.object["metadata"]["name"] == name]
            seen = [e for e in events if (e.object["metadata"].get("annotations") or {}).get("e2e/seen")]
            return got if seen else None

        got = await eventually(mine, what="the node's annotation in the watch")
        assert got[0] == "ADDED" and got[-1] == "MODIFIED"
    finally:
        stop.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_stale_resource_version_is_a_conflict(kube: KubeCluster, api: fleet.KubeApi) -> None:
    await api.ensure_namespace(NS)
    name = unique("stale")
    pod = await kube.create_pod(fleet.plain_pod(name, NS, scheduler="e2e-nobody"))
    old_rv = pod["metadata"]["resourceVersion"]
    fresh = await kube.patch_pod_annotations(NS, name, {"e2e/writer": "first"}, resource_version=old_rv)
    assert fresh["metadata"]["resourceVersion"] != old_rv
    with pytest.raises(Conflict):
        await kube.patch_pod_annotations(NS, name, {"e2e/writer": "second"}, resource_version=old_rv)
    assert (await kube.get_pod(NS, name))["metadata"]["annotations"]["e2e/writer"] == "first"
    # The same rule on nodes (the agent's inventory and label writes rely on it).
    node_name = unique("e2e-adapter-rv")
    node = await fleet.create_node(api, fleet.gpu_node(node_name, gpus=1))
    await kube.patch_node_annotations(node_name, {"e2e/x": "1"}, resource_version=node["metadata"]["resourceVersion"])
    with pytest.raises(Conflict):
        await kube.patch_node_annotations(node_name, {"e2e/x": "2"},
                                          resource_version=node["metadata"]["resourceVersion"])


async def test_binding_happens_once_and_checks_the_uid(kube: KubeCluster, api: fleet.KubeApi) -> None:
    await api.ensure_namespace(NS)
    for n in ("e2e-adapter-bind-a", "e2e-adapter-bind-b"):
        with contextlib.suppress(fleet.ApiStatus):
            await fleet.create_node(api, fleet.gpu_node(n, gpus=1))
    name = unique("bound")
    # A scheduler name nobody serves: only our Bindings place this pod.
    pod = await kube.create_pod(fleet.plain_pod(name, NS, scheduler="e2e-nobody"))
    uid = pod["metadata"]["uid"]
    # (Kubernetes 1.20 ignores the Binding's metadata.uid: the extender checks the UID itself before
    # binding, see test_extender_refuses_to_bind_a_recreated_pod.)
    await kube.create_binding(NS, name, uid, "e2e-adapter-bind-a", {"gpupool.io/test": "carried"})
    bound = await kube.get_pod(NS, name)
    assert bound["spec"]["nodeName"] == "e2e-adapter-bind-a"
    # The API server copies a Binding's annotations onto the pod: the extender's allocation relies on it.
    assert bound["metadata"]["annotations"]["gpupool.io/test"] == "carried"
    with pytest.raises(Conflict):
        await kube.create_binding(NS, name, uid, "e2e-adapter-bind-b")
    with pytest.raises(Conflict):  # not even to the same node again
        await kube.create_binding(NS, name, uid, "e2e-adapter-bind-a", {"gpupool.io/test": "carried"})
    bound = await kube.get_pod(NS, name)
    assert bound["spec"]["nodeName"] == "e2e-adapter-bind-a"
    # The API server copies a Binding's annotations onto the pod: the extender's allocation relies on it.
    assert bound["metadata"]["annotations"]["gpupool.io/test"] == "carried"
    with pytest.raises(NotFound):
        await kube.create_binding(NS, unique("missing"), uid, "e2e-adapter-bind-a")
    with pytest.raises(Conflict):  # deletion with a UID precondition leaves another pod alone
        await kube.delete_pod(NS, name, uid="00000000-0000-0000-0000-000000000000")
    await kube.delete_pod(NS, name, uid=uid)


async def test_conditional_node_writes_have_exactly_one_winner(kube: KubeCluster, api: fleet.KubeApi) -> None:
    """Ten writers race to annotate a node from the same resourceVersion: the API server lets exactly one
    through, and the node says which."""
    node_name = unique("e2e-adapter-race")
    node = await fleet.create_node(api, fleet.gpu_node(node_name, gpus=1))
    rv = node["metadata"]["resourceVersion"]

    async def take(i: int) -> str | None:
        try:
            await kube.patch_node_annotations(node_name, {"e2e/owner": f"writer-{i}"}, resource_version=rv)
        except Conflict:
            return None
        return f"writer-{i}"

    winners = [w for w in await asyncio.gather(*(take(i) for i in range(10))) if w]
    assert len(winners) == 1
    assert (await kube.get_node(node_name))["metadata"]["annotations"]["e2e/owner"] == winners[0]


async def test_leader_election_on_a_real_lease(testbed) -> None:  # type: ignore[no-untyped-def]
    """Two candidates on one Lease: one leads; when it stops renewing, the other takes over only after
    the lease expired, and the transition is counted on the Lease."""
    a_cluster = kube_cluster(testbed.kubeconfig())
    b_cluster = kube_cluster(testbed.kubeconfig())
    lease = unique("e2e-leader")
    # A 5 s lease renewed every 0.3 s: a loaded CI machine never lets it lapse by accident.
    a = LeaderElector(a_cluster, "kube-system", lease, "cand-a", lease_duration_s=5, renew_deadline_s=4,
                      retry_period_s=0.2)
    b = LeaderElector(b_cluster, "kube-system", lease, "cand-b", lease_duration_s=5, renew_deadline_s=4,
                      retry_period_s=0.2)
    try:
        assert await a.try_acquire_or_renew() is True
        assert await b.try_acquire_or_renew() is False
        run_b = asyncio.create_task(b.run())
        for _ in range(5):  # a keeps renewing: b never gets in
            assert await a.try_acquire_or_renew() is True
            await asyncio.sleep(0.3)
            assert not b.is_leader
        # a stops (a crash: no release). b must wait for renewTime + 5 s, then lead.
        await eventually(lambda: b.is_leader, timeout_s=30, step_s=0.1, what="b leads")
        held = await a_cluster.get_lease("kube-system", lease)
        assert held["spec"]["holderIdentity"] == "cand-b"
        assert held["spec"]["leaseTransitions"] == 1
        assert await a.try_acquire_or_renew() is False
        run_b.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run_b
    finally:
        await a_cluster.close()
        await b_cluster.close()


async def test_kube_adapter_reads_a_kubeconfig(testbed) -> None:  # type: ignore[no-untyped-def]
    """`gpupool scheduler --kubeconfig` builds its client with KubeCluster.from_config. Fails while
    from_config passes `context=` to lightkube's AsyncClient (lightkube 1.x: TypeError)."""
    cluster = KubeCluster.from_config(str(testbed.kubeconfig()))
    try:
        _, rv = await cluster.list_nodes()
        assert rv  # it reached the API server with the kubeconfig's token
    finally:
        await cluster.close()
