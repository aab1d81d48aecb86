"""The extender's trust boundary, attacked as a hostile client on 127.0.0.1 would (issue 12, "Why"), against
the real extender over HTTP on the embedded cluster. A request body only names its pod; everything else in
it is ignored, and requests naming no real pod of gpupool's are refused with the reason."""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

from gpupool.api.allocation import decode_allocation
from gpupool.api.names import ANN_ALLOCATION
from gpupool.cluster.memory import MemoryCluster
from gpupool.demo.embedded import Embedded, node_objects, start_embedded
from gpupool.scheduler.app import create_app
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.server import serve_in_background
from gpupool.scheduler.service import ExtenderService
from tests.scheduler.conftest import decided, gpu_pod, small_scenario

CLEAN = {"missing": [], "extra": [], "different": [], "overcommitted": []}


@pytest.fixture
async def emb() -> AsyncIterator[Embedded]:
    e = await start_embedded(small_scenario(), SchedulerConfig(port=0, leader_elect=False, lock_wait_s=2.0))
    yield e
    await e.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as c:
        yield c


def forged(pod: dict, cores: int | None, memory: int | None) -> dict:
    """A copy of `pod` (same UID and name) whose limits say something else."""
    fake = copy.deepcopy(pod)
    limits = fake["spec"]["containers"][0]["resources"]["limits"]
    for key, value in (("gpupool.io/gpu-cores", cores), ("gpupool.io/gpu-memory", memory)):
        if value is None:
            limits.pop(key, None)
        else:
            limits[key] = str(value)
    return fake


def phantom(name: str, cores: int = 100) -> dict:
    """A pod object no API server has ever seen."""
    pod = gpu_pod(name, cores=cores)
    pod["metadata"]["uid"] = str(uuid.uuid4())
    return pod


def bind_body(pod: dict, node: str) -> dict:
    m = pod["metadata"]
    return {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node}


async def settled(emb: Embedded) -> dict:
    """/debug/ledger once the watch confirmed every bind (no assumed entry left)."""
    for _ in range(500):
        if not emb.service.ledger.assumed():
            break
        await asyncio.sleep(0.01)
    return await emb.service.debug_ledger()


async def granted(emb: Embedded, name: str) -> tuple[float, int]:
    """(cores percent, memory MiB) of the pod's one-GPU allocation, from the API's pod."""
    pod = await emb.cluster.get_pod("default", name)
    [gpu] = decode_allocation(pod["metadata"]["annotations"][ANN_ALLOCATION]).gpus
    return gpu.cores, gpu.memory_mib


@pytest.mark.parametrize(("asks", "claims"), [
    ((10, 1024), (100, 16384)),  # inflated: a tenant asking 10 % / 1 GiB claims a whole 16 GiB GPU
    ((50, 8192), (1, 1)),  # deflated: someone starves a victim to 1 % / 1 MiB
])
async def test_forged_limits_in_filter_and_prioritize_do_not_change_the_allocation(emb, http, asks, claims):
    pod = await emb.cluster.create_pod(gpu_pod("victim", cores=asks[0], memory=asks[1]))
    fake = forged(pod, *claims)
    body = {"Pod": fake, "NodeNames": emb.node_names}
    assert decided((await http.post(f"{emb.url}/filter", json=body)).json(), emb.node_names)
    scores = (await http.post(f"{emb.url}/prioritize", json=body)).json()
    node = max(scores, key=lambda h: h["Score"])["Host"]
    # The nomination prioritize made is for what the API pod asks (10 % / 1024 MiB, or 50 % / 8192 MiB).
    [entry] = emb.service.ledger.entries.values()
    assert [(g.milli / 10, g.memory_mib) for g in entry.allocation.grants] == [asks]
    assert (await http.post(f"{emb.url}/bind", json=bind_body(pod, node))).json() == {"Error": ""}
    assert await granted(emb, "victim") == asks
    assert (await settled(emb))["diff"] == CLEAN


async def test_a_forged_scheduler_name_or_phase_in_the_body_changes_nothing(emb, http):
    pod = await emb.cluster.create_pod(gpu_pod("p", cores=20))
    fake = copy.deepcopy(pod)
    fake["spec"]["schedulerName"] = "evil-scheduler"
    fake["spec"]["nodeName"] = "elsewhere"
    fake["status"] = {"phase": "Succeeded"}
    body = (await http.post(f"{emb.url}/filter", json={"Pod": fake, "NodeNames": emb.node_names})).json()
    assert decided(body, emb.node_names)  # decided for the API pod: pending, gpupool's


async def test_debug_ledger_shows_state_forged_through_the_api(emb, http):
    """An allocation annotation written for more than the pod asks (by anyone with patch rights) is not
    hidden: the diff reports it against the pod's own spec."""
    pod = await emb.cluster.create_pod(gpu_pod("small", cores=10, memory=1024))
    assert (await http.post(f"{emb.url}/bind", json=bind_body(pod, emb.node_names[0]))).json() == {"Error": ""}
    assert (await settled(emb))["diff"] == CLEAN
    text = (await emb.cluster.get_pod("default", "small"))["metadata"]["annotations"][ANN_ALLOCATION]
    inflated = text.replace('"cores":10.0', '"cores":100.0').replace('"memory_mib":1024', '"memory_mib":16384')
    assert inflated != text
    await emb.cluster.patch_pod_annotations("default", "small", {ANN_ALLOCATION: inflated})
    for _ in range(200):
        diff = (await emb.service.debug_ledger())["diff"]
        if diff["overcommitted"]:
            break
        await asyncio.sleep(0.01)
    # its spec asks 10 percent / 1024 MiB per GPU; the API copy holds 100 percent / 16384 MiB
    assert any("small" in d and "spec asks for 10 percent / 1024 MiB" in d for d in diff["overcommitted"]), diff


async def test_prioritize_for_pods_that_do_not_exist_reserves_nothing(emb, http):
    before = emb.service.ledger.dump()
    for i in range(9):  # enough to hold the whole pool (16 GPUs) at 100 % each if they were believed
        body = {"Pod": phantom(f"ghost-{i}"), "NodeNames": emb.node_names}
        assert (await http.post(f"{emb.url}/prioritize", json=body)).json() == []
        answer = (await http.post(f"{emb.url}/filter", json=body)).json()
        assert answer["NodeNames"] == []
        assert all("does not exist" in why for why in answer["FailedAndUnresolvableNodes"].values())
    assert emb.service.ledger.entries == {} and emb.service.ledger.dump() == before
    assert emb.service.ledger.state.allocated_milli() == 0
    assert len(emb.service.pending) == 0  # nobody was noted as pending either
    # A real pod's name with a made-up UID is refused the same way (the UID is checked with the API).
    await emb.cluster.create_pod(gpu_pod("real", cores=50))
    impostor = phantom("real")
    assert (await http.post(f"{emb.url}/prioritize", json={"Pod": impostor, "NodeNames": emb.node_names})).json() == []
    assert emb.service.ledger.entries == {}
    # Other clients are served meanwhile.
    pod = await emb.cluster.create_pod(gpu_pod("honest", cores=50))
    assert decided((await http.post(f"{emb.url}/filter", json={"Pod": pod, "NodeNames": emb.node_names})).json(),
                   emb.node_names)


async def test_bind_of_a_pod_gpupool_does_not_schedule_is_refused(emb, http):
    for name, gpu in (("web", False), ("trainer", True)):
        spec = gpu_pod(name, cores=50) if gpu else {
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "1"}}}]}}
        spec["spec"]["schedulerName"] = "default-scheduler"
        pod = await emb.cluster.create_pod(spec)
        for node in (emb.node_names[0], "no-such-node"):
            error = (await http.post(f"{emb.url}/bind", json=bind_body(pod, node))).json()["Error"]
            assert "'default-scheduler'" in error and "spec.schedulerName" in error, error
        assert not (await emb.cluster.get_pod("default", name))["spec"].get("nodeName")
    # A pod without schedulerName is the API server's default scheduler's, too.
    bare = gpu_pod("bare", cores=50)
    del bare["spec"]["schedulerName"]
    pod = await emb.cluster.create_pod(bare)
    assert "default-scheduler" in (await http.post(f"{emb.url}/bind", json=bind_body(pod, emb.node_names[0]))).json()[
        "Error"]
    assert emb.service.ledger.entries == {} and emb.cluster.bindings == 0


async def test_bind_to_a_node_that_does_not_exist_or_has_no_gpus_is_refused(emb, http):
    await emb.cluster.create_node({"metadata": {"name": "cpu-node"}, "status": {"allocatable": {"cpu": "8"}}})
    gpu = await emb.cluster.create_pod(gpu_pod("gpu-job", cores=30))
    plain = await emb.cluster.create_pod({"metadata": {"name": "web", "namespace": "default"},
                                          "spec": {"schedulerName": "gpupool-scheduler", "containers": [
                                              {"name": "main", "resources": {"requests": {"cpu": "1"}}}]}})
    error = (await http.post(f"{emb.url}/bind", json=bind_body(gpu, "no-such-node"))).json()["Error"]
    assert "node no-such-node does not exist" in error
    error = (await http.post(f"{emb.url}/bind", json=bind_body(gpu, "cpu-node"))).json()["Error"]
    assert "no gpupool inventory" in error
    error = (await http.post(f"{emb.url}/bind", json=bind_body(plain, "no-such-node"))).json()["Error"]
    assert "node no-such-node does not exist" in error
    for name in ("gpu-job", "web"):
        assert not (await emb.cluster.get_pod("default", name))["spec"].get("nodeName")
    assert emb.cluster.bindings == 0 and emb.service.ledger.entries == {}
    # The CPU pod may go to the CPU node; the GPU pod to a GPU node.
    assert (await http.post(f"{emb.url}/bind", json=bind_body(plain, "cpu-node"))).json() == {"Error": ""}
    assert (await http.post(f"{emb.url}/bind", json=bind_body(gpu, emb.node_names[0]))).json() == {"Error": ""}


async def test_bind_of_a_pod_that_does_not_exist_or_with_another_uid_is_refused(emb, http):
    ghost = phantom("ghost")
    error = (await http.post(f"{emb.url}/bind", json=bind_body(ghost, emb.node_names[0]))).json()["Error"]
    assert "does not exist" in error
    real = await emb.cluster.create_pod(gpu_pod("real", cores=30))
    other = await emb.cluster.create_pod(gpu_pod("other", cores=30))
    mixed = bind_body(real, emb.node_names[0]) | {"PodUID": other["metadata"]["uid"]}
    error = (await http.post(f"{emb.url}/bind", json=mixed)).json()["Error"]
    assert "belongs to pod default/other" in error or "re-created" in error, error
    assert emb.cluster.bindings == 0 and emb.service.ledger.entries == {}


async def test_huge_names_are_refused_without_growing_any_state(emb, http):
    """20 /filter calls with 4 MiB names: refused before any lookup; pending map, pod lookups and the
    ledger do not grow; other clients are served."""
    svc = emb.service
    fetches = svc.pods.fetches
    for i in range(20):
        pod = phantom("x" * (4 * 1024 * 1024) + str(i))
        body = {"Pod": pod, "NodeNames": emb.node_names}
        answer = (await http.post(f"{emb.url}/filter", json=body)).json()
        assert answer["NodeNames"] == []
        assert set(answer["FailedAndUnresolvableNodes"].values()) == {"the request's pod name is not a valid pod name"}
    assert len(svc.pending) == 0 and svc.pods.fetches == fetches and svc.ledger.entries == {}
    assert len(emb.cluster.events) == 0  # nor written into Events
    pod = await emb.cluster.create_pod(gpu_pod("honest", cores=50))
    assert decided((await http.post(f"{emb.url}/filter", json={"Pod": pod, "NodeNames": emb.node_names})).json(),
                   emb.node_names)


async def test_300_fake_filters_do_not_teach_the_workload(emb, http):
    svc = emb.service
    real = await emb.cluster.create_pod(gpu_pod("real", cores=10))
    before = (await svc.debug_ledger())["workload"]
    for i in range(300):
        pod = forged(real, 100, None) if i % 2 else phantom(f"fake-{i}", cores=100)
        await http.post(f"{emb.url}/filter", json={"Pod": pod, "NodeNames": emb.node_names})
    assert (await svc.debug_ledger())["workload"] == before == []
    assert svc.workload.current == ()


@pytest.fixture
async def clocked() -> AsyncIterator[tuple[ExtenderService, str, list[float], MemoryCluster]]:
    """The extender over real HTTP with a clock the test moves, few pending entries kept."""
    cluster = MemoryCluster()
    for obj in node_objects(small_scenario(nodes=1, gpus=1)):
        await cluster.create_node(obj)
    now = [10_000.0]
    config = SchedulerConfig(port=0, leader_elect=False, max_pending_pods=5, pending_ttl_s=60)
    svc = ExtenderService(cluster, config, clock=lambda: now[0])
    await svc.start()
    server = await serve_in_background(create_app(svc), "127.0.0.1", 0)
    yield svc, server.url, now, cluster
    await server.stop()
    await svc.stop()


async def test_pending_entries_are_bounded_and_expire(clocked, http):
    svc, url, now, cluster = clocked
    names = ["gpu-0000"]
    # One 1-GPU node; eight pods asking for 2 GPUs fit nowhere: each is noted pending, at most 5 kept.
    pods = [await cluster.create_pod(gpu_pod(f"big-{i}", cores=None, gpus=2)) for i in range(8)]
    for pod in pods:
        now[0] += 1
        answer = (await http.post(f"{url}/filter", json={"Pod": pod, "NodeNames": names})).json()
        assert answer["NodeNames"] == []
    assert sorted(svc.pending) == [f"default/big-{i}" for i in range(3, 8)]  # the oldest notes went first
    why, since = svc.pending["default/big-7"]
    assert "needs 2 healthy GPU(s)" in why and since == 10_008.0
    now[0] += 55  # 10_063: big-3, noted last at 10_004, was noted 59 s ago: within pending_ttl_s (60 s)
    assert "default/big-3" in svc.pending
    now[0] += 2.5  # 10_065.5: 61.5 s after big-3, 60.5 s after big-4: both gone; big-5 (59.5 s) stays
    assert sorted(svc.pending) == [f"default/big-{i}" for i in range(5, 8)]
    now[0] += 60
    assert len(svc.pending) == 0


async def test_node_names_from_the_caller_reach_reasons_and_the_pending_list_escaped(emb, http):
    pod = await emb.cluster.create_pod(gpu_pod("p", cores=50))
    evil = "n\x1b[2J\x1b]8;;http://evil\x1b\\" + "y" * 1000
    answer = (await http.post(f"{emb.url}/filter", json={"Pod": pod, "NodeNames": [evil]})).json()
    reason = answer["FailedAndUnresolvableNodes"][evil]
    assert "\x1b" not in reason and reason.startswith("node n\\x1b[2J\\x1b]8;;http://evil\\x1b\\\\yyy")
    assert len(reason) < 120  # 64 characters of the name shown, the rest counted
    why, _ = emb.service.pending["default/p"]
    assert "\x1b" not in why and len(why) < 200
    error = (await http.post(f"{emb.url}/bind", json=bind_body(pod, evil))).json()["Error"]
    assert "\x1b" not in error and "does not exist" in error
