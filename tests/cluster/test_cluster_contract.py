"""Contract of the cluster port: what the scheduler relies on from the API server.

The `cluster` fixture yields the memory adapter. To run the same tests against a real API server later,
add a fixture parameter that yields `KubeCluster` on a throw-away namespace; the tests only use the port.
"""

from __future__ import annotations

import asyncio

import pytest

from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import PODS, AlreadyExists, Conflict, Gone, NotFound


@pytest.fixture(params=["memory"])
async def cluster(request):
    c = MemoryCluster()
    yield c
    await c.close()


def _pod(name: str, namespace: str = "default") -> dict:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"containers": [{"name": "c"}]}}


async def test_resource_version_bumps_on_every_write_and_stale_writes_conflict(cluster):
    pod = await cluster.create_pod(_pod("a"))
    rv1 = pod["metadata"]["resourceVersion"]
    pod2 = await cluster.patch_pod_annotations("default", "a", {"x": "1"}, resource_version=rv1)
    rv2 = pod2["metadata"]["resourceVersion"]
    assert rv2 != rv1
    with pytest.raises(Conflict):
        await cluster.patch_pod_annotations("default", "a", {"x": "2"}, resource_version=rv1)
    assert (await cluster.get_pod("default", "a"))["metadata"]["annotations"] == {"x": "1"}
    # None removes a key; no precondition = last writer wins
    pod3 = await cluster.patch_pod_annotations("default", "a", {"x": None})
    assert pod3["metadata"].get("annotations") == {}


async def test_node_annotation_precondition(cluster):
    node = await cluster.create_node({"metadata": {"name": "n1"}})
    await cluster.patch_node_annotations("n1", {"lock": "a"}, resource_version=node["metadata"]["resourceVersion"])
    with pytest.raises(Conflict):
        await cluster.patch_node_annotations("n1", {"lock": "b"}, resource_version=node["metadata"]["resourceVersion"])
    assert (await cluster.get_node("n1"))["metadata"]["annotations"]["lock"] == "a"


async def test_node_labels_merge(cluster):
    await cluster.create_node({"metadata": {"name": "n2", "labels": {"keep": "1", "drop": "x"}}})
    node = await cluster.patch_node_labels("n2", {"gpupool.io/model": "H100-80GB", "drop": None})
    assert node["metadata"]["labels"] == {"keep": "1", "gpupool.io/model": "H100-80GB"}
    assert (await cluster.get_node("n2"))["metadata"]["labels"] == node["metadata"]["labels"]


async def test_binding_sets_node_once_and_checks_uid(cluster):
    pod = await cluster.create_pod(_pod("a"))
    uid = pod["metadata"]["uid"]
    with pytest.raises(Conflict):
        await cluster.create_binding("default", "a", "other-uid", "n1")
    await cluster.create_binding("default", "a", uid, "n1")
    assert (await cluster.get_pod("default", "a"))["spec"]["nodeName"] == "n1"
    with pytest.raises(Conflict):
        await cluster.create_binding("default", "a", uid, "n2")
    with pytest.raises(NotFound):
        await cluster.create_binding("default", "missing", uid, "n1")


async def test_binding_writes_its_annotations_in_the_same_change(cluster):
    spec = _pod("b")
    spec["metadata"]["annotations"] = {"keep": "1"}
    pod = await cluster.create_pod(spec)
    stream = cluster.watch_pods(pod["metadata"]["resourceVersion"])
    await cluster.create_binding("default", "b", pod["metadata"]["uid"], "n1", {"gpupool.io/allocation": "x"})
    event = await asyncio.wait_for(anext(stream), timeout=5)
    await stream.aclose()
    # One event carries both: no observer ever sees the pod bound without its annotation.
    assert event.type == "MODIFIED" and event.object["spec"]["nodeName"] == "n1"
    assert event.object["metadata"]["annotations"] == {"keep": "1", "gpupool.io/allocation": "x"}


async def test_create_twice_and_missing_objects(cluster):
    await cluster.create_pod(_pod("a"))
    with pytest.raises(AlreadyExists):
        await cluster.create_pod(_pod("a"))
    with pytest.raises(NotFound):
        await cluster.get_pod("default", "nope")
    with pytest.raises(NotFound):
        await cluster.patch_pod_annotations("default", "nope", {"a": "b"})


async def test_delete_with_uid_precondition_and_finalizers(cluster):
    old = await cluster.create_pod(_pod("a"))
    await cluster.delete_pod("default", "a")
    await cluster.create_pod(_pod("a"))
    with pytest.raises(Conflict):
        await cluster.delete_pod("default", "a", uid=old["metadata"]["uid"])
    p = _pod("f")
    p["metadata"]["finalizers"] = ["example.com/keep"]
    await cluster.create_pod(p)
    await cluster.delete_pod("default", "f")
    assert "deletionTimestamp" in (await cluster.get_pod("default", "f"))["metadata"]


async def test_watch_resumes_from_resource_version_and_sees_every_change(cluster):
    _, rv = await cluster.list_pods()
    await cluster.create_pod(_pod("a"))
    pod = await cluster.patch_pod_annotations("default", "a", {"k": "v"})
    await cluster.delete_pod("default", "a")
    seen = []
    stream = cluster.watch_pods(rv)
    async for ev in stream:
        seen.append((ev.type, ev.object["metadata"]["name"]))
        if len(seen) == 3:
            break
    await stream.aclose()
    assert seen == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    # Starting after the patch only shows the deletion.
    stream = cluster.watch_pods(pod["metadata"]["resourceVersion"])
    first = await asyncio.wait_for(stream.__anext__(), 5)
    await stream.aclose()
    assert first.type == "DELETED"


async def test_watch_delivers_live_events(cluster):
    _, rv = await cluster.list_nodes()
    stream = cluster.watch_nodes(rv)
    nxt = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0)
    await cluster.create_node({"metadata": {"name": "n9"}})
    ev = await asyncio.wait_for(nxt, 5)
    await stream.aclose()
    assert (ev.type, ev.object["metadata"]["name"]) == ("ADDED", "n9")


async def test_lease_create_and_replace_with_precondition(cluster):
    lease = await cluster.create_lease(
        {"metadata": {"name": "l", "namespace": "kube-system"}, "spec": {"holderIdentity": "a"}}
    )
    lease["spec"]["holderIdentity"] = "b"
    updated = await cluster.replace_lease(lease)
    assert updated["spec"]["holderIdentity"] == "b"
    lease["spec"]["holderIdentity"] = "c"  # still carries the old resourceVersion
    with pytest.raises(Conflict):
        await cluster.replace_lease(lease)
    assert (await cluster.get_lease("kube-system", "l"))["spec"]["holderIdentity"] == "b"


async def test_memory_watch_too_old_is_gone():
    c = MemoryCluster()
    kind = c._kind(PODS)
    kind.dropped_before = 10  # as if the history had been trimmed
    with pytest.raises(Gone):
        async for _ in c.watch_pods("3"):
            pass
