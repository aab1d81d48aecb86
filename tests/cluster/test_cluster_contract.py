"""Contract of the cluster port: what the services rely on from the API server, checked on both adapters —
the embedded cluster and the `kube` adapter on a real kube-apiserver 1.20 (gpupool.testing.testbed: etcd +
kube-apiserver, started once for this module, ~20 s; the `kube` half is marked e2e).

Every test works in its own namespace (and names its cluster-scoped objects after it), so the real server
needs no clean-up between tests. A missing Kubernetes binary fails the `kube` half with the command that
builds it (as tests/e2e does); nothing skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from gpupool.cluster.kube import KubeCluster
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import (
    CRDS,
    NAMESPACES,
    PODS,
    RESOURCE_SLICES,
    AlreadyExists,
    ClusterPort,
    Conflict,
    Gone,
    Invalid,
    Kind,
    NotFound,
    Obj,
    TooManyRequests,
    WatchEvent,
)
from gpupool.cluster.reflector import Reflector
from tests.harness import testbed as tb

QUEUES = Kind("gpupool.io", "v1alpha1", "GPUQueue", "gpuqueues", namespaced=False)
QUEUE_CRD: Obj = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "gpuqueues.gpupool.io"},
    "spec": {
        "group": "gpupool.io",
        "scope": "Cluster",
        "names": {"plural": "gpuqueues", "singular": "gpuqueue", "kind": "GPUQueue", "listKind": "GPUQueueList"},
        "versions": [{
            "name": "v1alpha1", "served": True, "storage": True,
            "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        }],
    },
}
_n = itertools.count()


@pytest.fixture(scope="module")
def real_server() -> Iterator[tb.Testbed]:
    try:
        tb.find_binaries()
    except tb.TestbedError as e:
        pytest.fail(f"{e}\nbuild them with: scripts/k8s-testbed build", pytrace=False)
    bed = tb.Testbed().start()
    try:
        yield bed
    finally:
        bed.stop()


@pytest.fixture(params=["memory", pytest.param("kube", marks=pytest.mark.e2e)])
def backend(request: pytest.FixtureRequest) -> tb.Testbed | None:
    return request.getfixturevalue("real_server") if request.param == "kube" else None


@pytest.fixture
async def cluster(backend: tb.Testbed | None) -> AsyncIterator[ClusterPort]:
    c: ClusterPort = MemoryCluster() if backend is None else KubeCluster.from_config(str(backend.kubeconfig()))
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
async def ns(cluster: ClusterPort) -> str:
    """A namespace of this test's own (also the prefix of its cluster-scoped objects' names)."""
    name = f"contract-{next(_n)}"
    await cluster.create_object(NAMESPACES, {"metadata": {"name": name}})
    return name


def _pod(name: str, namespace: str, labels: dict[str, str] | None = None) -> Obj:
    # terminationGracePeriodSeconds 0: with no kubelet, a deleted pod goes at once on the real server too
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "c", "image": "registry.invalid/c"}]}}


async def _install_queue_crd(cluster: ClusterPort) -> None:
    """The GPUQueue CRD, once, and wait until the server serves it (Established)."""
    with contextlib.suppress(AlreadyExists):
        await cluster.create_object(CRDS, QUEUE_CRD)
    for _ in range(200):  # the API server establishes a CRD within a second or two; this only bounds the wait
        crd = await cluster.get_object(CRDS, "gpuqueues.gpupool.io")
        conditions = (crd.get("status") or {}).get("conditions") or []
        if isinstance(cluster, MemoryCluster) or any(
            c.get("type") == "Established" and c.get("status") == "True" for c in conditions
        ):
            break
        await asyncio.sleep(0.05)
    for _ in range(200):  # and until the new endpoint answers
        try:
            await cluster.list_objects(QUEUES)
            return
        except (NotFound, TooManyRequests):  # 1.37 answers 429 while the new kind's storage initialises
            await asyncio.sleep(0.05)


async def _next(stream: AsyncIterator[WatchEvent]) -> WatchEvent:
    return await asyncio.wait_for(anext(stream), timeout=10)


# --- the scheduler's and the agent's operations --------------------------------------------------------


async def test_resource_version_bumps_on_every_write_and_stale_writes_conflict(cluster: ClusterPort, ns: str) -> None:
    pod = await cluster.create_pod(_pod("a", ns))
    rv1 = pod["metadata"]["resourceVersion"]
    pod2 = await cluster.patch_pod_annotations(ns, "a", {"x": "1"}, resource_version=rv1)
    rv2 = pod2["metadata"]["resourceVersion"]
    assert rv2 != rv1
    with pytest.raises(Conflict):
        await cluster.patch_pod_annotations(ns, "a", {"x": "2"}, resource_version=rv1)
    assert (await cluster.get_pod(ns, "a"))["metadata"]["annotations"] == {"x": "1"}
    # None removes a key; no precondition = last writer wins
    pod3 = await cluster.patch_pod_annotations(ns, "a", {"x": None})
    assert not pod3["metadata"].get("annotations")


async def test_node_annotation_precondition(cluster: ClusterPort, ns: str) -> None:
    await cluster.create_node({"metadata": {"name": f"{ns}-n1"}})
    # A real cluster's controllers write to a new node too (the TTL controller annotates it): take the
    # latest version, and read again if one of them wrote in between.
    for _ in range(50):
        rv = (await cluster.get_node(f"{ns}-n1"))["metadata"]["resourceVersion"]
        try:
            await cluster.patch_node_annotations(f"{ns}-n1", {"lock": "a"}, resource_version=rv)
            break
        except Conflict:
            await asyncio.sleep(0.1)
    with pytest.raises(Conflict):
        await cluster.patch_node_annotations(f"{ns}-n1", {"lock": "b"}, resource_version=rv)
    assert (await cluster.get_node(f"{ns}-n1"))["metadata"]["annotations"]["lock"] == "a"


async def test_node_labels_merge(cluster: ClusterPort, ns: str) -> None:
    await cluster.create_node({"metadata": {"name": f"{ns}-n2", "labels": {"keep": "1", "drop": "x"}}})
    node = await cluster.patch_node_labels(f"{ns}-n2", {"gpupool.io/model": "H100-80GB", "drop": None})
    assert node["metadata"]["labels"] == {"keep": "1", "gpupool.io/model": "H100-80GB"}
    assert (await cluster.get_node(f"{ns}-n2"))["metadata"]["labels"] == node["metadata"]["labels"]


async def test_binding_sets_node_once_and_checks_uid(cluster: ClusterPort, ns: str) -> None:
    pod = await cluster.create_pod(_pod("a", ns))
    uid = pod["metadata"]["uid"]
    if isinstance(cluster, MemoryCluster):  # kube-apiserver 1.20 does not check a Binding's UID; newer ones do
        with pytest.raises(Conflict):
            await cluster.create_binding(ns, "a", "other-uid", "n1")
    await cluster.create_binding(ns, "a", uid, "n1")
    assert (await cluster.get_pod(ns, "a"))["spec"]["nodeName"] == "n1"
    with pytest.raises(Conflict):
        await cluster.create_binding(ns, "a", uid, "n2")
    with pytest.raises(NotFound):
        await cluster.create_binding(ns, "missing", uid, "n1")


async def test_binding_writes_its_annotations_in_the_same_change(cluster: ClusterPort, ns: str) -> None:
    spec = _pod("b", ns)
    spec["metadata"]["annotations"] = {"keep": "1"}
    pod = await cluster.create_pod(spec)
    stream = cluster.watch_pods(pod["metadata"]["resourceVersion"], fields={"metadata.namespace": ns})
    await cluster.create_binding(ns, "b", pod["metadata"]["uid"], "n1", {"gpupool.io/allocation": "x"})
    event = await _next(stream)
    await stream.aclose()  # type: ignore[attr-defined]
    # One event carries both: no observer ever sees the pod bound without its annotation.
    assert event.type == "MODIFIED" and event.object["spec"]["nodeName"] == "n1"
    assert event.object["metadata"]["annotations"] == {"keep": "1", "gpupool.io/allocation": "x"}


async def test_create_twice_and_missing_objects(cluster: ClusterPort, ns: str) -> None:
    await cluster.create_pod(_pod("a", ns))
    with pytest.raises(AlreadyExists):
        await cluster.create_pod(_pod("a", ns))
    with pytest.raises(NotFound):
        await cluster.get_pod(ns, "nope")
    with pytest.raises(NotFound):
        await cluster.patch_pod_annotations(ns, "nope", {"a": "b"})


async def test_delete_with_uid_precondition_and_finalizers(cluster: ClusterPort, ns: str) -> None:
    old = await cluster.create_pod(_pod("a", ns))
    await cluster.delete_pod(ns, "a")
    await cluster.create_pod(_pod("a", ns))
    with pytest.raises(Conflict):
        await cluster.delete_pod(ns, "a", uid=old["metadata"]["uid"])
    p = _pod("f", ns)
    p["metadata"]["finalizers"] = ["example.com/keep"]
    await cluster.create_pod(p)
    await cluster.delete_pod(ns, "f")
    assert "deletionTimestamp" in (await cluster.get_pod(ns, "f"))["metadata"]
    # removing the last finalizer completes the deletion
    await cluster.patch_object(PODS, "f", {"metadata": {"finalizers": None}}, namespace=ns)
    with pytest.raises(NotFound):
        await cluster.get_pod(ns, "f")


async def test_watch_resumes_from_resource_version_and_sees_every_change(cluster: ClusterPort, ns: str) -> None:
    _, rv = await cluster.list_pods(fields={"metadata.namespace": ns})
    await cluster.create_pod(_pod("a", ns))
    pod = await cluster.patch_pod_annotations(ns, "a", {"k": "v"})
    await cluster.delete_pod(ns, "a")
    seen: list[str] = []
    stream = cluster.watch_pods(rv, fields={"metadata.namespace": ns})
    while not seen or seen[-1] != "DELETED":
        seen.append((await _next(stream)).type)
    await stream.aclose()  # type: ignore[attr-defined]
    # (the real server may show the deletionTimestamp as one more MODIFIED before the DELETED)
    assert seen[:2] == ["ADDED", "MODIFIED"] and set(seen[2:-1]) <= {"MODIFIED"}
    # Starting after the patch shows only what came after.
    stream = cluster.watch_pods(pod["metadata"]["resourceVersion"], fields={"metadata.namespace": ns})
    first = await _next(stream)
    await stream.aclose()  # type: ignore[attr-defined]
    assert first.type == "DELETED" or "deletionTimestamp" in first.object["metadata"]


async def test_watch_delivers_live_events(cluster: ClusterPort, ns: str) -> None:
    _, rv = await cluster.list_nodes(fields={"metadata.name": f"{ns}-n9"})
    stream = cluster.watch_nodes(rv, fields={"metadata.name": f"{ns}-n9"})
    nxt = asyncio.ensure_future(_next(stream))
    await asyncio.sleep(0.2)  # let the watch reach the server before the change (either order passes)
    await cluster.create_node({"metadata": {"name": f"{ns}-n9"}})
    ev = await nxt
    await stream.aclose()  # type: ignore[attr-defined]
    assert (ev.type, ev.object["metadata"]["name"]) == ("ADDED", f"{ns}-n9")


async def test_lease_create_and_replace_with_precondition(cluster: ClusterPort, ns: str) -> None:
    lease = await cluster.create_lease({"metadata": {"name": "l", "namespace": ns}, "spec": {"holderIdentity": "a"}})
    lease["spec"]["holderIdentity"] = "b"
    updated = await cluster.replace_lease(lease)
    assert updated["spec"]["holderIdentity"] == "b"
    lease["spec"]["holderIdentity"] = "c"  # still carries the old resourceVersion
    with pytest.raises(Conflict):
        await cluster.replace_lease(lease)
    assert (await cluster.get_lease(ns, "l"))["spec"]["holderIdentity"] == "b"


# --- selectors ------------------------------------------------------------------------------------------


async def test_field_selectors_list_one_nodes_pods(cluster: ClusterPort, ns: str) -> None:
    for name, node in (("on-a", "node-a"), ("also-a", "node-a"), ("on-b", "node-b"), ("unbound", None)):
        pod = await cluster.create_pod(_pod(name, ns))
        if node is not None:
            await cluster.create_binding(ns, name, pod["metadata"]["uid"], node)
    here = {"metadata.namespace": ns}

    async def names(**fields: str) -> set[str]:
        pods, _ = await cluster.list_pods(fields={**here, **fields})
        return {p["metadata"]["name"] for p in pods}

    assert await names(**{"spec.nodeName": "node-a"}) == {"on-a", "also-a"}
    assert await names(**{"spec.nodeName": ""}) == {"unbound"}  # the API server's "not scheduled yet"
    assert await names(**{"metadata.name": "on-b"}) == {"on-b"}
    assert await names(**{"status.phase": "Pending"}) == {"on-a", "also-a", "on-b", "unbound"}
    with pytest.raises(Invalid, match="field label not supported"):
        await cluster.list_pods(fields={"spec.containers": "c"})


async def test_label_selectors_and_namespaces(cluster: ClusterPort, ns: str) -> None:
    other = f"{ns}-other"
    await cluster.create_object(NAMESPACES, {"metadata": {"name": other}})
    await cluster.create_pod(_pod("gpu", ns, {"gpupool.io/managed": "true", "team": "a"}))
    await cluster.create_pod(_pod("cpu", ns, {"team": "a"}))
    await cluster.create_pod(_pod("gpu", other, {"gpupool.io/managed": "true", "team": "b"}))
    pods, _ = await cluster.list_objects(PODS, namespace=ns, labels={"team": "a"})
    assert {p["metadata"]["name"] for p in pods} == {"gpu", "cpu"}
    pods, _ = await cluster.list_objects(PODS, labels={"gpupool.io/managed": "true"})
    assert {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods} == {(ns, "gpu"), (other, "gpu")}
    pods, _ = await cluster.list_objects(PODS, namespace=other, labels={"gpupool.io/managed": "true", "team": "a"})
    assert pods == []


async def test_a_selector_watch_reports_objects_entering_and_leaving(cluster: ClusterPort, ns: str) -> None:
    await cluster.create_pod(_pod("p", ns, {"team": "a"}))
    _, rv = await cluster.list_objects(PODS, namespace=ns, labels={"team": "b"})
    stream = cluster.watch_objects(PODS, rv, namespace=ns, labels={"team": "b"})
    await cluster.patch_object(PODS, "p", {"metadata": {"labels": {"team": "b"}}}, namespace=ns)
    await cluster.patch_object(PODS, "p", {"metadata": {"annotations": {"x": "1"}}}, namespace=ns)
    await cluster.patch_object(PODS, "p", {"metadata": {"labels": {"team": "c"}}}, namespace=ns)
    seen = [(e.type, e.object["metadata"]["labels"]["team"]) for e in [await _next(stream) for _ in range(3)]]
    await stream.aclose()  # type: ignore[attr-defined]
    # leaving the selection is a DELETED carrying the last state that matched, as the API server sends it
    assert seen == [("ADDED", "b"), ("MODIFIED", "b"), ("DELETED", "b")]


# --- any kind: custom resources --------------------------------------------------------------------------


async def test_a_custom_resource_is_served_once_its_crd_exists(cluster: ClusterPort, ns: str) -> None:
    missing = Kind("gpupool.io", "v1alpha1", "NoSuchThing", "nosuchthings", namespaced=False)
    with pytest.raises(NotFound):
        await cluster.list_objects(missing)
    await _install_queue_crd(cluster)
    name = f"{ns}-research"
    created = await cluster.create_object(
        QUEUES, {"metadata": {"name": name, "labels": {"tier": "gold"}}, "spec": {"weight": 2, "quotaMilli": 4000}}
    )
    assert (created["apiVersion"], created["kind"]) == ("gpupool.io/v1alpha1", "GPUQueue")
    assert created["metadata"]["uid"] and created["spec"] == {"weight": 2, "quotaMilli": 4000}
    got = await cluster.get_object(QUEUES, name)
    assert got["metadata"]["uid"] == created["metadata"]["uid"]
    listed, _ = await cluster.list_objects(QUEUES, labels={"tier": "gold"}, fields={"metadata.name": name})
    assert [q["metadata"]["name"] for q in listed] == [name]
    with pytest.raises(AlreadyExists):
        await cluster.create_object(QUEUES, {"metadata": {"name": name}, "spec": {}})


async def test_custom_resource_patch_status_subresource_watch_and_delete(cluster: ClusterPort, ns: str) -> None:
    await _install_queue_crd(cluster)
    name = f"{ns}-q"
    created = await cluster.create_object(QUEUES, {"metadata": {"name": name}, "spec": {"weight": 1, "drop": "x"}})
    rv = created["metadata"]["resourceVersion"]
    stream = cluster.watch_objects(QUEUES, rv, fields={"metadata.name": name})
    # a merge patch: keys merge, None removes; status on the main resource is ignored (status subresource)
    patched = await cluster.patch_object(
        QUEUES, name, {"spec": {"weight": 3, "drop": None}, "status": {"admitted": 9}}, resource_version=rv
    )
    assert patched["spec"] == {"weight": 3} and "status" not in patched
    with pytest.raises(Conflict):
        await cluster.patch_object(QUEUES, name, {"spec": {"weight": 4}}, resource_version=rv)
    status = await cluster.patch_object(QUEUES, name, {"status": {"admitted": 2}}, subresource="status")
    assert status["status"] == {"admitted": 2} and status["spec"] == {"weight": 3}
    with pytest.raises(Conflict):
        await cluster.delete_object(QUEUES, name, uid="not-the-uid")
    await cluster.delete_object(QUEUES, name, uid=created["metadata"]["uid"])
    with pytest.raises(NotFound):
        await cluster.get_object(QUEUES, name)
    seen = [(await _next(stream)).type for _ in range(3)]
    await stream.aclose()  # type: ignore[attr-defined]
    assert seen == ["MODIFIED", "MODIFIED", "DELETED"]


# --- the embedded cluster only ----------------------------------------------------------------------------


async def test_memory_serves_resource_k8s_io() -> None:
    """DRA objects (resource.k8s.io/v1, Kubernetes 1.34+): the real-server half needs a newer testbed than
    1.20, so only the embedded cluster is checked here; the kube adapter reaches them through the same
    generic path as the custom resource above."""
    c = MemoryCluster()
    created = await c.create_object(RESOURCE_SLICES, {
        "metadata": {"name": "node-1-gpupool.io"},
        "spec": {"nodeName": "node-1", "driver": "gpu.gpupool.io", "pool": {"name": "node-1", "generation": 1,
                 "resourceSliceCount": 1}, "devices": [{"name": "gpu-0"}]},
    })
    assert created["apiVersion"] == "resource.k8s.io/v1"
    listed, _ = await c.list_objects(RESOURCE_SLICES, fields={"metadata.name": "node-1-gpupool.io"})
    assert [s["spec"]["devices"] for s in listed] == [[{"name": "gpu-0"}]]


async def test_memory_watch_too_old_is_gone() -> None:
    c = MemoryCluster()
    c._kind(PODS).dropped_before = 10  # as if the history had been trimmed
    with pytest.raises(Gone):
        async for _ in c.watch_pods("3"):
            pass


# --- the shared reflector on both adapters ---------------------------------------------------------------


class _StaleFirstWatch:
    """The port, except that its first watch starts from resourceVersion 1, older than the server's history.
    The embedded cluster (history trimmed here) answers 410 Gone and the reflector relists; kube-apiserver
    1.20 with a watch cache that has not wrapped yet replays its current objects as ADDED instead (measured
    on the testbed), which the reflector must take as no change."""

    def __init__(self, port: ClusterPort) -> None:
        self.port = port
        self.watches = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.port, name)

    def watch_objects(self, kind: Kind, resource_version: str, **selectors: Any) -> AsyncIterator[WatchEvent]:
        self.watches += 1
        return self.port.watch_objects(kind, "1" if self.watches == 1 else resource_version, **selectors)


async def test_the_reflector_follows_the_server_from_a_stale_version(cluster: ClusterPort, ns: str) -> None:
    embedded = isinstance(cluster, MemoryCluster)
    if isinstance(cluster, MemoryCluster):
        cluster._kind(PODS).dropped_before = 2  # the embedded server's history "trimmed" below version 2
    before = await cluster.create_pod(_pod("before", ns))
    port = _StaleFirstWatch(cluster)
    changes: list[tuple[str, str]] = []
    seen = asyncio.Event()

    def record(type_: str, obj: Obj, old: Obj | None) -> None:
        changes.append((type_, obj["metadata"]["name"]))
        seen.set()

    reflector = Reflector(port, PODS, namespace=ns, on_event=record)
    reflector.start()
    try:
        await asyncio.wait_for(reflector.wait_synced(), 10)
        await cluster.create_pod(_pod("after", ns))
        await cluster.delete_pod(ns, "before")
        while ("DELETED", "before") not in changes or ("ADDED", "after") not in changes:
            seen.clear()
            await asyncio.wait_for(seen.wait(), 10)
        # "before" was added once (a replay of it is no change) and deleted last (the real server shows the
        # deletionTimestamp as a MODIFIED first)
        mine = [c for c in changes if c[1] == "before"]
        assert mine[0] == ("ADDED", "before") and mine[-1] == ("DELETED", "before")
        assert set(mine[1:-1]) <= {("MODIFIED", "before")} and len(mine) <= 3
        assert {k[1] for k in reflector.store} == {"after"}
        assert reflector.get_by_uid(before["metadata"]["uid"]) is None
        if embedded:
            assert reflector.lists == 2 and "Gone" in reflector.last_error
    finally:
        await reflector.stop()
