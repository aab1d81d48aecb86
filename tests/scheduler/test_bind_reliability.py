"""Reliability of bind: storms, replays, re-created pods, crashes at every step, deletion in every phase,
and 409 handling. The invariant checker recomputes allocations from API objects only."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from gpupool.api.allocation import decode_allocation
from gpupool.api.extender import ExtenderBindingArgs
from gpupool.api.names import ANN_ALLOCATION
from gpupool.api.node_objects import nodes_from_objects
from gpupool.api.recompute import recompute
from gpupool.cluster.memory import MemoryCluster
from gpupool.demo.embedded import node_objects, start_embedded
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.service import ExtenderService
from tests.scheduler.conftest import gpu_pod, record_pod_reads, small_scenario


async def settle(svc: ExtenderService, timeout: float = 10.0) -> dict:
    """Wait until the ledger equals the recomputation from the API (watch caught up); return the diff."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        dbg = await svc.debug_ledger()
        if not any(dbg["diff"].values()) and not svc.ledger.assumed() or loop.time() > deadline:
            return dbg["diff"]
        await asyncio.sleep(0.02)


def per_gpu_usage(nodes: list[dict], pods: list[dict]) -> tuple[dict, dict]:
    """(usage, capacity) per GPU uuid from API objects: cores %, memory MiB."""
    gpu_nodes, _ = nodes_from_objects(nodes)
    cap = {g.uuid: (100.0, g.memory_mib) for n in gpu_nodes for g in n.gpus}
    used: dict[str, list[float]] = {u: [0.0, 0] for u in cap}
    for c in recompute(nodes, pods).allocations.values():
        for g in c.allocation.grants:
            used[g.uuid][0] += g.milli / 10
            used[g.uuid][1] += g.memory_mib
    return used, cap


def assert_within_capacity(nodes: list[dict], pods: list[dict]) -> None:
    used, cap = per_gpu_usage(nodes, pods)
    for uuid, (cores, mem) in used.items():
        assert cores <= cap[uuid][0] + 1e-9, f"GPU {uuid} compute over capacity: {cores}%"
        assert mem <= cap[uuid][1], f"GPU {uuid} memory over capacity: {mem} MiB"


@pytest.fixture
async def slow_api():
    """The embedded extender on an API server that takes 2 ms per call, so concurrent binds interleave."""
    config = SchedulerConfig(port=0, leader_elect=False, lock_wait_s=2.0)
    emb = await start_embedded(small_scenario(), config, api_latency_s=0.002)
    yield emb
    await emb.stop()


async def test_bind_storm_never_overcommits(slow_api, client):
    """500 share pods, 8 concurrent kube-scheduler workers, 16 GPUs (2 nodes x 8, 16 GiB each)."""
    embedded = slow_api
    rng = random.Random(42)
    shapes = [(rng.randint(1, 9) * 10, rng.choice([None, 1024, 2048, 4096, 8192])) for _ in range(500)]
    queue: asyncio.Queue = asyncio.Queue()
    for i, (cores, mem) in enumerate(shapes):
        queue.put_nowait(await embedded.cluster.create_pod(gpu_pod(f"s{i:03d}", cores=cores, memory=mem)))
    url = embedded.url
    violations: list[str] = []
    stop = asyncio.Event()

    async def checker() -> None:
        while not stop.is_set():
            nodes, _ = await embedded.cluster.list_nodes()
            pods, _ = await embedded.cluster.list_pods()
            try:
                assert_within_capacity(nodes, pods)
            except AssertionError as e:
                violations.append(str(e))
            await asyncio.sleep(0.05)

    async def worker() -> None:
        while not queue.empty():
            pod = queue.get_nowait()
            body = {"Pod": pod, "NodeNames": embedded.node_names}
            feasible = (await client.post(f"{url}/filter", json=body)).json()["NodeNames"]
            if not feasible:
                continue
            body["NodeNames"] = feasible
            scores = (await client.post(f"{url}/prioritize", json=body)).json()
            node = max(scores, key=lambda h: h["Score"])["Host"] if scores else feasible[0]
            meta = pod["metadata"]
            args = {"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": node}
            await client.post(f"{url}/bind", json=args)

    check = asyncio.create_task(checker())
    await asyncio.gather(*(worker() for _ in range(8)))
    stop.set()
    await check
    assert violations == []
    assert await settle(embedded.service) == {"missing": [], "extra": [], "different": [], "overcommitted": []}
    nodes, _ = await embedded.cluster.list_nodes()
    pods, _ = await embedded.cluster.list_pods()
    assert_within_capacity(nodes, pods)
    counted = recompute(nodes, pods).allocations
    bound = 0
    for p in pods:
        ann = (p["metadata"].get("annotations") or {}).get(ANN_ALLOCATION)
        if p["spec"].get("nodeName"):
            bound += 1
            assert p["metadata"]["uid"] in counted, f"{p['metadata']['name']} bound without an allocation"
            assert decode_allocation(ann).node == p["spec"]["nodeName"]
        else:
            assert ann is None, f"{p['metadata']['name']} unbound but annotated"
    assert bound == len(counted) == len(embedded.service.ledger.entries)
    assert bound > 16  # shares really were packed several to a GPU


async def test_replayed_bind_changes_nothing(embedded, client):
    pod = await embedded.cluster.create_pod(gpu_pod("p", cores=30))
    args = {"PodName": "p", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"],
            "Node": embedded.node_names[0]}
    assert (await client.post(f"{embedded.url}/bind", json=args)).json()["Error"] == ""
    await settle(embedded.service)
    before = await embedded.cluster.get_pod("default", "p")
    ledger_before = embedded.service.ledger.dump()
    bindings = embedded.cluster.bindings
    results = await asyncio.gather(*(client.post(f"{embedded.url}/bind", json=args) for _ in range(3)))
    assert [r.json()["Error"] for r in results] == ["", "", ""]
    after = await embedded.cluster.get_pod("default", "p")
    assert after["metadata"]["annotations"][ANN_ALLOCATION] == before["metadata"]["annotations"][ANN_ALLOCATION]
    assert embedded.cluster.bindings == bindings
    assert embedded.service.ledger.dump() == ledger_before
    # A replay naming another node is refused and changes nothing either.
    other = dict(args, Node=embedded.node_names[1])
    assert "already bound" in (await client.post(f"{embedded.url}/bind", json=other)).json()["Error"]
    assert embedded.service.ledger.dump() == ledger_before


async def test_concurrent_replays_of_a_bind_in_flight_write_once():
    cluster = await _cluster_with_nodes()
    svc = ExtenderService(cluster, CONFIG)
    await svc.start()
    pod = await cluster.create_pod(gpu_pod("p", cores=30))
    calls: list[str] = []
    original = cluster.create_binding

    async def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args[1])
        await asyncio.sleep(0.01)  # a network round trip: the replays run meanwhile
        return await original(*args, **kwargs)

    cluster.create_binding = counting  # type: ignore[method-assign]
    results = await asyncio.gather(*(svc.bind(_args(pod)) for _ in range(3)))
    assert [r.Error for r in results] == ["", "", ""]
    assert calls == ["p"]  # one Binding written; the replays found it done
    assert cluster.bindings == 1
    await svc.stop()


async def test_recreated_pod_never_gets_the_old_allocation(embedded, client):
    old = await embedded.cluster.create_pod(gpu_pod("same", cores=60))
    body = {"Pod": old, "NodeNames": embedded.node_names}
    assert (await client.post(f"{embedded.url}/filter", json=body)).json()["NodeNames"]
    await embedded.cluster.delete_pod("default", "same")
    new = await embedded.cluster.create_pod(gpu_pod("same", cores=60))
    args = {"PodName": "same", "PodNamespace": "default", "PodUID": old["metadata"]["uid"],
            "Node": embedded.node_names[0]}
    error = (await client.post(f"{embedded.url}/bind", json=args)).json()["Error"]
    assert "re-created" in error
    current = await embedded.cluster.get_pod("default", "same")
    assert current["metadata"]["uid"] == new["metadata"]["uid"]
    assert not current["spec"].get("nodeName")
    assert ANN_ALLOCATION not in current["metadata"].get("annotations", {})
    assert embedded.service.ledger.entries == {}


class Crash(BaseException):
    """Stands for kill -9: not an Exception, so no cleanup code runs."""


async def _cluster_with_nodes(nodes: int = 1) -> MemoryCluster:
    cluster = MemoryCluster()
    for obj in node_objects(small_scenario(nodes=nodes)):
        await cluster.create_node(obj)
    return cluster


def _args(pod: dict, node: str = "gpu-0000") -> ExtenderBindingArgs:
    m = pod["metadata"]
    return ExtenderBindingArgs(PodName=m["name"], PodNamespace=m["namespace"], PodUID=m["uid"], Node=node)


CONFIG = SchedulerConfig(leader_elect=False, lock_wait_s=0.5)


@pytest.mark.parametrize("step", ["assumed", "locked", "bound"])
async def test_crash_after_each_step_converges_after_restart(step):
    cluster = await _cluster_with_nodes()

    def crash_at(name: str) -> None:
        if name == step:
            raise Crash(name)

    svc = ExtenderService(cluster, CONFIG, step_hook=crash_at)
    await svc.start()
    pod = await cluster.create_pod(gpu_pod("victim", cores=50, memory=4096))
    with pytest.raises(Crash):
        await svc.bind(_args(pod))
    await svc.stop()  # the process is gone; its memory with it

    restarted = ExtenderService(cluster, CONFIG)
    await restarted.start()
    diff = await settle(restarted)
    assert diff == {"missing": [], "extra": [], "different": [], "overcommitted": []}
    assert restarted.ledger.assumed() == {}  # no orphan reservation
    held = {e.key for e in restarted.ledger.entries.values()}
    assert held == ({"default/victim"} if step == "bound" else set())
    # kube-scheduler retries the bind: it completes, or finds it already done, without double counting.
    assert (await restarted.bind(_args(pod))).Error == ""
    await settle(restarted)
    assert [e.key for e in restarted.ledger.entries.values()] == ["default/victim"]
    state = restarted.ledger.state
    assert int(state.gpu_sharers.sum()) == 1 and state.allocated_milli() == 500
    await restarted.stop()


async def _wait(predicate, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("step", ["assumed", "locked"])
async def test_delete_during_bind_returns_capacity(step):
    cluster = await _cluster_with_nodes()
    pod = await cluster.create_pod(gpu_pod("gone", cores=50))

    async def delete_at(name: str) -> None:
        if name == step:
            await cluster.delete_pod("default", "gone")

    svc = ExtenderService(cluster, CONFIG, step_hook=delete_at)
    await svc.start()
    result = await svc.bind(_args(pod))
    assert result.Error != ""
    assert await settle(svc) == {"missing": [], "extra": [], "different": [], "overcommitted": []}
    assert svc.ledger.entries == {} and svc.ledger.state.allocated_milli() == 0
    assert svc.busy.waiting_on("gpu-0000", svc.clock(), other_than="") is None  # the failed bind let go of it
    await svc.stop()


@pytest.mark.parametrize("phase", ["bound", "running", "terminating", "force", "succeeded"])
async def test_delete_after_bind_returns_capacity(phase):
    cluster = await _cluster_with_nodes()
    svc = ExtenderService(cluster, CONFIG)
    await svc.start()
    spec = gpu_pod("p", cores=70)
    if phase == "terminating":
        spec["metadata"]["finalizers"] = ["example.com/cleanup"]
    pod = await cluster.create_pod(spec)
    assert (await svc.bind(_args(pod))).Error == ""
    await _wait(lambda: svc.ledger.confirmed())
    if phase in ("running", "succeeded"):
        await cluster.patch_pod_status("default", "p", {"phase": "Running"})
    if phase == "succeeded":
        await cluster.patch_pod_status("default", "p", {"phase": "Succeeded"})
    else:
        await cluster.delete_pod("default", "p")
    if phase == "terminating":
        await asyncio.sleep(0.05)
        assert svc.ledger.state.allocated_milli() == 700  # still running its shutdown: still holds the GPU
        await cluster.remove_finalizers("default", "p")
    await _wait(lambda: svc.ledger.state.allocated_milli() == 0)
    assert await settle(svc) == {"missing": [], "extra": [], "different": [], "overcommitted": []}
    await svc.stop()


async def test_pod_written_by_someone_else_during_bind_keeps_both_writes():
    cluster = await _cluster_with_nodes()
    pod = await cluster.create_pod(gpu_pod("p", cores=40))

    async def meddle(name: str) -> None:
        if name == "locked":  # someone else annotates the pod between our read and our Binding
            await cluster.patch_pod_annotations("default", "p", {"team": "x"})

    svc = ExtenderService(cluster, CONFIG, step_hook=meddle)
    await svc.start()
    assert (await svc.bind(_args(pod))).Error == ""
    final = await cluster.get_pod("default", "p")
    # The Binding merges the allocation into the annotations: the other writer's key survives.
    assert final["metadata"]["annotations"]["team"] == "x"
    assert decode_allocation(final["metadata"]["annotations"][ANN_ALLOCATION]).pod_uid == pod["metadata"]["uid"]
    assert await settle(svc) == {"missing": [], "extra": [], "different": [], "overcommitted": []}
    await svc.stop()


async def test_a_node_with_a_pod_awaiting_allocate_fails_the_bind_then_expiry_frees_it():
    cluster = await _cluster_with_nodes()
    now = [1_000_000.0]
    svc = ExtenderService(cluster, SchedulerConfig(leader_elect=False, lock_wait_s=0.0, lock_timeout_s=60),
                          clock=lambda: now[0])
    await svc.start()
    first = await cluster.create_pod(gpu_pod("first", cores=10))
    second = await cluster.create_pod(gpu_pod("second", cores=10))
    assert (await svc.bind(_args(first))).Error == ""  # no agent here: "first" keeps waiting for Allocate
    error = (await svc.bind(_args(second))).Error
    assert "node gpu-0000 has pod default/first" in error
    assert set(svc.ledger.entries) == {first["metadata"]["uid"]}  # the failed bind reserved nothing
    now[0] += 61  # "first" was bound longer than lock_timeout_s ago
    assert (await svc.bind(_args(second))).Error == ""
    await svc.stop()


async def test_assumed_entry_is_forgotten_after_timeout():
    cluster = await _cluster_with_nodes()
    now = [1000.0]
    svc = ExtenderService(cluster, SchedulerConfig(leader_elect=False, assume_timeout_s=5), clock=lambda: now[0])
    await svc.start()
    pod = await cluster.create_pod(gpu_pod("p", cores=10))

    def crash(name: str) -> None:
        if name == "assumed":
            raise Crash(name)

    svc.step_hook = crash
    with pytest.raises(Crash):
        await svc.bind(_args(pod))
    assert len(svc.ledger.assumed()) == 1
    now[0] += 6
    assert len(svc.ledger.expire(now[0])) == 1
    assert svc.ledger.entries == {} and int(np.sum(svc.ledger.state.gpu_sharers)) == 0
    await svc.stop()


async def test_prioritize_reserves_the_winner_so_the_next_filter_sees_it():
    cluster = await _cluster_with_nodes(nodes=2)
    now = [5000.0]
    svc = ExtenderService(cluster, SchedulerConfig(leader_elect=False, nominate_timeout_s=10),
                          clock=lambda: now[0])
    await svc.start()
    from gpupool.api.extender import ExtenderArgs

    names = ["gpu-0000", "gpu-0001"]
    # Fill every GPU but one (GPU 7 of gpu-0001) with whole-GPU pods.
    for i in range(15):
        p = await cluster.create_pod(gpu_pod(f"w{i}", cores=None))
        assert (await svc.bind(_args(p, node=names[i // 8]))).Error == ""
        await cluster.patch_pod_status("default", f"w{i}", {"phase": "Running"})  # its Allocate happened
    a = await cluster.create_pod(gpu_pod("a", cores=60))
    b = await cluster.create_pod(gpu_pod("b", cores=60))
    assert (await svc.filter(ExtenderArgs(Pod=a, NodeNames=names))).NodeNames == ["gpu-0001"]  # one node left: reserved
    # b is filtered while a's bind is still on its way: the 60 % a will get is already taken.
    assert (await svc.filter(ExtenderArgs(Pod=b, NodeNames=names))).NodeNames == []
    # a new cycle for a itself does not count its own reservation against it
    assert (await svc.filter(ExtenderArgs(Pod=a, NodeNames=names))).NodeNames == ["gpu-0001"]
    assert (await svc.bind(_args(a, node="gpu-0001"))).Error == ""
    assert (await svc.filter(ExtenderArgs(Pod=b, NodeNames=names))).NodeNames == []
    # A reservation whose bind never comes is dropped after nominate_timeout_s.
    c = await cluster.create_pod(gpu_pod("c", cores=30))
    d = await cluster.create_pod(gpu_pod("d", cores=20))
    assert [h for h, _ in (await svc.prioritize(ExtenderArgs(Pod=c, NodeNames=names)))] == ["gpu-0001"]
    assert (await svc.filter(ExtenderArgs(Pod=d, NodeNames=names))).NodeNames == []  # 60 + 30 + 20 > 100
    now[0] += 11
    svc.ledger.expire(now[0])
    assert (await svc.filter(ExtenderArgs(Pod=d, NodeNames=names))).NodeNames == ["gpu-0001"]
    await svc.stop()


async def test_a_new_cycle_during_a_slow_bind_keeps_that_bind_reservation():
    cluster = await _cluster_with_nodes(nodes=2)
    svc = ExtenderService(cluster, CONFIG)
    await svc.start()
    from gpupool.api.extender import ExtenderArgs

    pod = await cluster.create_pod(gpu_pod("slow", cores=70))
    seen: list[bool] = []

    async def retry_meanwhile(step: str) -> None:
        if step == "locked":  # kube-scheduler timed out waiting and starts a new cycle for the pod
            await svc.filter(ExtenderArgs(Pod=pod, NodeNames=["gpu-0000", "gpu-0001"]))
            seen.append(pod["metadata"]["uid"] in svc.ledger.entries)

    svc.step_hook = retry_meanwhile
    assert (await svc.bind(_args(pod))).Error == ""
    assert seen == [True]
    assert await settle(svc) == {"missing": [], "extra": [], "different": [], "overcommitted": []}
    assert svc.ledger.state.allocated_milli() == 700
    await svc.stop()


async def test_bind_after_the_filtered_pod_was_re_created_binds_nothing():
    """Bind reads its pod from the watch cache by UID; once the watch showed the old pod deleted, the old UID
    is read from the API server, which has a new pod of that name: the old decision must not bind it."""
    from gpupool.api.extender import ExtenderArgs

    cluster = await _cluster_with_nodes()
    svc = ExtenderService(cluster, CONFIG)
    await svc.start()
    old = await cluster.create_pod(gpu_pod("again", cores=30))
    assert (await svc.filter(ExtenderArgs(Pod=old, NodeNames=["gpu-0000"]))).NodeNames == ["gpu-0000"]
    await cluster.delete_pod("default", "again")
    await _wait(lambda: svc.pods.get(old["metadata"]["uid"]) is None)
    new = await cluster.create_pod(gpu_pod("again", cores=30))
    result = await svc.bind(_args(old))
    assert "was re-created" in result.Error
    assert not (await cluster.get_pod("default", "again"))["spec"].get("nodeName")
    assert new["metadata"]["uid"] not in svc.ledger.entries
    await svc.stop()


async def test_bind_reads_its_pod_from_the_watch_cache():
    from gpupool.api.extender import ExtenderArgs

    cluster = await _cluster_with_nodes()
    svc = ExtenderService(cluster, CONFIG)
    await svc.start()
    pod = await cluster.create_pod(gpu_pod("p", cores=30))
    uid = pod["metadata"]["uid"]
    await _wait(lambda: svc.pods.get(uid) is not None)
    await svc.filter(ExtenderArgs(Pod=pod, NodeNames=["gpu-0000"]))
    reads = record_pod_reads(cluster)
    assert (await svc.bind(_args(pod))).Error == ""
    assert reads == []  # the cache had it
    await _wait(lambda: (svc.pods.get(uid) or {}).get("spec", {}).get("nodeName") == "gpu-0000")
    bindings = cluster.bindings
    assert (await svc.bind(_args(pod))).Error == ""  # replayed: the cache shows it bound with its allocation
    assert reads == [] and cluster.bindings == bindings
    assert await settle(svc) == {"missing": [], "extra": [], "different": [], "overcommitted": []}
    await svc.stop()
