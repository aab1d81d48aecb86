"""Busy nodes: a node with a GPU pod between scheduling and device allocation is passed over by prioritize
while another node fits, so a burst of pods is not serialised on one node's bind lock."""

from __future__ import annotations

from gpupool.api.extender import ExtenderArgs
from gpupool.api.lock import ANN_BIND_LOCK, encode_lock
from gpupool.api.names import ANN_ALLOCATED
from gpupool.scheduler.busy import BusyNodes
from gpupool.scheduler.service import ExtenderService
from tests.scheduler.conftest import bind_args, eventually, gpu_pod, record_pod_reads, started_service


def _pod(uid: str, phase: str = "Pending", annotations: dict | None = None) -> dict:
    return {"metadata": {"uid": uid, "name": uid, "namespace": "default", "annotations": annotations or {}},
            "spec": {"nodeName": "n1"}, "status": {"phase": phase}}


def _node(name: str, lock_uid: str | None) -> dict:
    annotations = {ANN_BIND_LOCK: encode_lock(lock_uid, "default", lock_uid, 0.0)} if lock_uid else {}
    return {"metadata": {"name": name, "annotations": annotations}}


def test_a_hold_lasts_until_the_pod_is_served():
    busy = BusyNodes()
    busy.nominated("a", "n1", until=100.0)
    busy.locked("b", "n2", until=100.0)
    busy.locked("c", "n3", until=100.0)
    busy.locked("d", "n4", until=100.0)
    assert busy.names(now=0.0) == {"n1", "n2", "n3", "n4"}
    assert busy.on_pod("MODIFIED", _pod("a")) is None  # still Pending, nothing allocated: still busy
    assert busy.on_pod("MODIFIED", _pod("b", phase="Running")) == "n2"
    assert busy.on_pod("MODIFIED", _pod("c", annotations={ANN_ALLOCATED: "t"})) == "n3"
    assert busy.on_pod("DELETED", _pod("d")) == "n4"
    assert busy.names(now=0.0) == {"n1"}


def test_a_node_event_frees_only_a_locked_hold_whose_lock_is_gone():
    busy = BusyNodes()
    busy.nominated("a", "n1", until=100.0)  # not locked yet: a node without a lock says nothing about it
    busy.locked("b", "n2", until=100.0)
    busy.locked("c", "n3", until=100.0)
    busy.on_node(_node("n1", None))
    busy.on_node(_node("n2", "b"))  # its own lock: still waiting for Allocate
    busy.on_node(_node("n3", None))  # the agent removed the lock after Allocate
    assert busy.names(now=0.0) == {"n1", "n2"}
    busy.on_node(_node("n2", "someone-else"))  # taken over (timeout): b no longer holds it
    assert busy.names(now=0.0) == {"n1"}


def test_holds_expire():
    busy = BusyNodes()
    busy.nominated("a", "n1", until=10.0)
    assert busy.names(now=9.9) == {"n1"}
    assert busy.names(now=10.0) == set()


async def _winner(svc: ExtenderService, pod: dict, names: list[str]) -> str:
    scores = dict(await svc.prioritize(ExtenderArgs(Pod=pod, NodeNames=names)))
    return max(scores, key=lambda n: scores[n])


async def test_prioritize_passes_over_a_busy_node_while_another_fits():
    svc = await started_service(nodes=2)
    cluster = svc.cluster
    names = ["gpu-0000", "gpu-0001"]
    a, b, c = [await cluster.create_pod(gpu_pod(n, cores=20)) for n in ("a", "b", "c")]

    first = await _winner(svc, a, names)
    other = next(n for n in names if n != first)
    assert (await svc.bind(bind_args(a, first))).Error == ""
    # a is bound but not yet allocated: its node is busy, so b goes to the other node, which fits.
    assert await _winner(svc, b, names) == other
    svc.ledger.forget(b["metadata"]["uid"])  # (b's cycle ends without a bind)
    svc.busy.release(b["metadata"]["uid"])
    # Once a runs (its Allocate happened), the policy's own choice, packing next to a, is back.
    await cluster.patch_pod_status("default", "a", {"phase": "Running"})
    await eventually(lambda: first not in svc.busy.names(svc.clock()))
    assert await _winner(svc, c, names) == first
    await svc.stop()


async def test_a_busy_node_still_wins_when_no_other_node_fits():
    svc = await started_service(nodes=1)
    a, b = [await svc.cluster.create_pod(gpu_pod(n, cores=20)) for n in ("a", "b")]
    assert (await svc.bind(bind_args(a))).Error == ""
    assert svc.busy.names(svc.clock()) == {"gpu-0000"}
    assert await _winner(svc, b, ["gpu-0000"]) == "gpu-0000"
    await svc.stop()


def test_a_served_pod_is_remembered_until_its_hold_would_have_ended():
    busy = BusyNodes()
    busy.locked("a", "n1", until=50.0)
    assert not busy.was_served("a", now=0.0)
    busy.on_pod("MODIFIED", _pod("a", phase="Running"))
    assert busy.was_served("a", now=49.0)
    assert not busy.was_served("a", now=50.0)


async def test_lock_of_a_pod_seen_running_is_taken_over_without_asking_about_the_holder():
    svc = await started_service(nodes=1)
    cluster = svc.cluster
    a, b = [await cluster.create_pod(gpu_pod(n, cores=20)) for n in ("a", "b")]
    assert (await svc.bind(bind_args(a))).Error == ""
    await cluster.patch_pod_status("default", "a", {"phase": "Running"})
    await eventually(lambda: not svc.busy.names(svc.clock()))
    reads = record_pod_reads(cluster)
    assert (await svc.bind(bind_args(b))).Error == ""
    assert reads == []  # b came from the pod cache, a's state from the watch
    node = await cluster.get_node("gpu-0000")
    assert b["metadata"]["uid"] in node["metadata"]["annotations"][ANN_BIND_LOCK]
    await svc.stop()


async def test_lock_of_a_holder_the_pod_watch_shows_running_needs_no_read_either():
    """A lock this process never saw served (taken by an earlier scheduler process, say): the pod watch's
    copy of the holder, Running, is enough to take it over."""
    svc = await started_service(nodes=1)
    cluster = svc.cluster
    a, b = [await cluster.create_pod(gpu_pod(n, cores=20)) for n in ("a", "b")]
    held = encode_lock(a["metadata"]["uid"], "default", "a", svc.clock())
    node = await cluster.get_node("gpu-0000")
    await cluster.patch_node_annotations("gpu-0000", {ANN_BIND_LOCK: held},
                                         resource_version=node["metadata"]["resourceVersion"])
    await cluster.patch_pod_status("default", "a", {"phase": "Running"})
    uid_a = a["metadata"]["uid"]
    await eventually(lambda: ((svc.pods.get(uid_a) or {}).get("status") or {}).get("phase") == "Running"
                     and held in str(svc.ledger.node_objs["gpu-0000"]["metadata"].get("annotations")))
    assert not svc.busy.was_served(uid_a, svc.clock())
    reads = record_pod_reads(cluster)
    assert (await svc.bind(bind_args(b))).Error == ""
    assert reads == []
    node = await cluster.get_node("gpu-0000")
    assert b["metadata"]["uid"] in node["metadata"]["annotations"][ANN_BIND_LOCK]
    await svc.stop()


async def test_a_stale_watch_copy_showing_our_own_lock_is_checked_against_the_api():
    svc = await started_service(nodes=1)
    pod = await svc.cluster.create_pod(gpu_pod("p", cores=20))
    uid = pod["metadata"]["uid"]
    # The watch's copy claims p holds the lock (as after a failed bind whose release is not seen yet);
    # the API server has no lock. The bind must take the lock for real.
    seen = svc.ledger.node_objs["gpu-0000"]
    annotations = {**(seen["metadata"].get("annotations") or {}), ANN_BIND_LOCK: encode_lock(uid, "default", "p", 0)}
    svc.ledger.node_objs["gpu-0000"] = {**seen, "metadata": {**seen["metadata"], "annotations": annotations}}
    assert (await svc.bind(bind_args(pod))).Error == ""
    node = await svc.cluster.get_node("gpu-0000")
    assert uid in node["metadata"]["annotations"][ANN_BIND_LOCK]
    await svc.stop()


async def test_with_avoid_busy_nodes_off_the_policy_pick_stands():
    from gpupool.scheduler.config import SchedulerConfig

    svc = await started_service(nodes=2, config=SchedulerConfig(leader_elect=False, avoid_busy_nodes=False))
    a, b = [await svc.cluster.create_pod(gpu_pod(n, cores=20)) for n in ("a", "b")]
    names = ["gpu-0000", "gpu-0001"]
    first = await _winner(svc, a, names)
    assert (await svc.bind(bind_args(a, first))).Error == ""
    assert svc.busy.names(svc.clock()) == {first}
    assert await _winner(svc, b, names) == first  # busy, and still chosen: packing wins over bind latency
    await svc.stop()
