"""Busy nodes: one GPU pod per node between its bind and its device allocation (the node agent serves only
the single pod that waits), kept in memory from this process's binds and the pod watch; and prioritize
passes over a busy node while another node fits, so a burst of pods is not serialised on one node."""

from __future__ import annotations

import asyncio
import json

from gpupool.api.extender import ExtenderArgs
from gpupool.api.names import ANN_ALLOCATED, ANN_ALLOCATION
from gpupool.cluster.memory import MemoryCluster
from gpupool.scheduler.busy import BusyNodes
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.service import ExtenderService
from tests.scheduler.conftest import bind_args, eventually, gpu_pod, record_pod_reads, started_service


def _pod(uid: str, phase: str = "Pending", annotations: dict | None = None, node: str | None = "n1") -> dict:
    return {"metadata": {"uid": uid, "name": uid, "namespace": "default", "annotations": annotations or {}},
            "spec": {"nodeName": node} if node else {}, "status": {"phase": phase}}


def _allocated_for(node: str, time: str) -> dict:
    doc = {"version": 1, "pod_uid": "x", "node": node, "time": time,
           "gpus": [{"uuid": "GPU-0", "index": 0, "memory_mib": 1024, "cores": 10.0}]}
    return {ANN_ALLOCATION: json.dumps(doc)}


def test_a_hold_lasts_until_the_pod_is_served():
    busy = BusyNodes(lock_timeout_s=100.0)
    busy.nominated("a", "n1", until=100.0)
    busy.bound("b", "default/b", "n2", now=0.0)
    busy.bound("c", "default/c", "n3", now=0.0)
    busy.bound("d", "default/d", "n4", now=0.0)
    assert busy.names(now=0.0) == {"n1", "n2", "n3", "n4"}
    assert busy.names(now=0.0, other_than="a") == {"n2", "n3", "n4"}  # a pod is not steered off its own node
    assert busy.on_pod("MODIFIED", _pod("a", node=None)) is None  # still Pending, nothing allocated: still busy
    assert busy.on_pod("MODIFIED", _pod("b", phase="Running")) == "n2"
    assert busy.on_pod("MODIFIED", _pod("c", annotations={ANN_ALLOCATED: "t"})) == "n3"
    assert busy.on_pod("DELETED", _pod("d")) == "n4"
    assert busy.names(now=0.0) == {"n1"}


def test_only_a_bound_pod_blocks_another_bind_and_never_its_own():
    busy = BusyNodes(lock_timeout_s=100.0)
    busy.nominated("a", "n1", until=100.0)
    assert busy.waiting_on("n1", now=0.0, other_than="z") is None  # nominated only: not bound
    busy.bound("b", "default/b", "n1", now=0.0)
    held = busy.waiting_on("n1", now=0.0, other_than="z")
    assert held is not None and held.key == "default/b"
    assert busy.waiting_on("n1", now=0.0, other_than="b") is None  # a replayed bind of b itself
    assert busy.waiting_on("n2", now=0.0, other_than="z") is None


def test_a_failed_cycle_forgets_a_nomination_but_not_a_bind():
    busy = BusyNodes(lock_timeout_s=100.0)
    busy.nominated("a", "n1", until=100.0)
    busy.bound("b", "default/b", "n2", now=0.0)
    busy.forget_nomination("a")
    busy.forget_nomination("b")  # e.g. a refused bind of b to another node: b still waits on n2
    assert busy.names(now=0.0) == {"n2"} and busy.bound_to("b") == "n2"
    busy.unbind("b")  # the bind that took n2 failed after taking it
    assert busy.names(now=0.0) == set()


def test_a_bound_hold_ends_after_the_lock_timeout():
    busy = BusyNodes(lock_timeout_s=300.0)
    busy.bound("b", "default/b", "n1", now=1000.0)
    assert busy.waiting_on("n1", now=1299.9, other_than="z") is not None
    assert busy.waiting_on("n1", now=1300.0, other_than="z") is None  # 1000 + 300


def test_a_pod_bound_by_an_earlier_run_is_adopted_with_its_bind_time():
    busy = BusyNodes(lock_timeout_s=300.0)
    # 2026-11-21T06:00:00Z is 1,795,240,800 s since the epoch; the hold ends 300 s later.
    pod = _pod("e", annotations=_allocated_for("n1", "2026-11-21T06:00:00Z"))
    assert busy.on_pod("ADDED", pod) is None
    held = busy.waiting_on("n1", now=1_795_240_800.0 + 299, other_than="z")
    assert held is not None and (held.key, held.since) == ("default/e", 1_795_240_800.0)
    assert busy.waiting_on("n1", now=1_795_240_800.0 + 300, other_than="z") is None


def test_pods_that_cannot_wait_for_an_allocate_here_are_not_adopted():
    busy = BusyNodes(lock_timeout_s=300.0)
    now = 1_795_240_800.0
    busy.on_pod("ADDED", _pod("p", annotations=_allocated_for("other-node", "2026-11-21T06:00:00Z")))
    busy.on_pod("ADDED", _pod("q", annotations={ANN_ALLOCATION: "{not json"}))
    busy.on_pod("ADDED", _pod("r"))  # bound without an allocation: not gpupool's to wait for
    busy.on_pod("ADDED", _pod("s", phase="Running", annotations=_allocated_for("n1", "2026-11-21T06:00:00Z")))
    assert busy.names(now) == set()


def test_a_relist_drops_the_holds_of_pods_that_are_gone():
    busy = BusyNodes(lock_timeout_s=300.0)
    busy.bound("gone", "default/gone", "n1", now=0.0)
    busy.bound("kept", "default/kept", "n2", now=0.0)
    busy.nominated("nominee", "n3", until=10.0)
    busy.replace([_pod("kept", node=None), _pod("nominee", node=None)])
    assert busy.names(now=0.0) == {"n2", "n3"}


def test_holds_expire():
    busy = BusyNodes(lock_timeout_s=300.0)
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
    svc.busy.forget_nomination(b["metadata"]["uid"])
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


def _count_node_writes(cluster: MemoryCluster) -> list[str]:
    writes: list[str] = []
    patch = cluster.patch_node_annotations

    async def counting(name, annotations, resource_version=None):  # type: ignore[no-untyped-def]
        writes.append(name)
        return await patch(name, annotations, resource_version=resource_version)

    cluster.patch_node_annotations = counting  # type: ignore[method-assign]
    return writes


async def test_the_next_bind_waits_for_the_pod_before_it_and_needs_no_read_nor_node_write():
    svc = await started_service(nodes=1)
    cluster = svc.cluster
    a, b = [await cluster.create_pod(gpu_pod(n, cores=20)) for n in ("a", "b")]
    writes = _count_node_writes(cluster)
    reads = record_pod_reads(cluster)
    assert (await svc.bind(bind_args(a))).Error == ""
    second = asyncio.create_task(svc.bind(bind_args(b)))
    await asyncio.sleep(0.3)
    assert not second.done()  # a waits for its Allocate: b's bind waits in Permit
    await cluster.patch_pod_status("default", "a", {"phase": "Running"})  # kubelet ran a: Allocate done
    assert (await asyncio.wait_for(second, 5)).Error == ""
    assert reads == [] and writes == []  # both pods from the cache, a's state from the watch, no Node write
    bound = await cluster.get_pod("default", "b")
    assert bound["spec"]["nodeName"] == "gpu-0000" and ANN_ALLOCATION in bound["metadata"]["annotations"]
    await svc.stop()


async def test_a_restarted_scheduler_still_holds_the_node_of_a_pod_bound_before_it():
    cfg = SchedulerConfig(leader_elect=False, lock_wait_s=0.0)
    svc = await started_service(nodes=1, config=cfg)
    cluster = svc.cluster
    a, b = [await cluster.create_pod(gpu_pod(n, cores=20)) for n in ("a", "b")]
    assert (await svc.bind(bind_args(a))).Error == ""
    await svc.stop()

    again = ExtenderService(cluster, cfg)
    await again.start()
    refused = (await again.bind(bind_args(b))).Error
    assert "node gpu-0000 has pod default/a" in refused and "waiting for its device allocation" in refused
    await cluster.patch_pod_status("default", "a", {"phase": "Running"})
    await eventually(lambda: not again.busy.names(again.clock()))
    assert (await again.bind(bind_args(b))).Error == ""
    await again.stop()


async def test_with_avoid_busy_nodes_off_the_policy_pick_stands():
    svc = await started_service(nodes=2, config=SchedulerConfig(leader_elect=False, avoid_busy_nodes=False))
    a, b = [await svc.cluster.create_pod(gpu_pod(n, cores=20)) for n in ("a", "b")]
    names = ["gpu-0000", "gpu-0001"]
    first = await _winner(svc, a, names)
    assert (await svc.bind(bind_args(a, first))).Error == ""
    assert svc.busy.names(svc.clock()) == {first}
    assert await _winner(svc, b, names) == first  # busy, and still chosen: packing wins over bind latency
    await svc.stop()
