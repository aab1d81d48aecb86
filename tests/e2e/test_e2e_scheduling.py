"""The real kube-scheduler with the gpupool extender wired in as the Helm chart configures it: 200 share
pods over 20 fake GPU nodes, plus pods that ask for no GPU; then a burst during which the extender process
is killed and restarted."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from gpupool.api.names import ANN_ALLOCATION
from tests.e2e.conftest import Extender
from tests.e2e.e2e_checks import allocation_problems, eventually
from tests.harness import fleet

pytestmark = pytest.mark.e2e


async def _create_all(api: fleet.KubeApi, pods: list[dict], parallel: int = 16) -> None:
    gate = asyncio.Semaphore(parallel)

    async def one(p: dict) -> None:
        async with gate:
            await api.create_pod(p)

    await asyncio.gather(*(one(p) for p in pods))


async def _pods(api: fleet.KubeApi, ns: str) -> list[dict]:
    return (await api.list_pods(ns))[0]


def _all_bound(expected: int):  # type: ignore[no-untyped-def]
    def check(pods: list[dict]) -> bool:
        return len(pods) == expected and all(p["spec"].get("nodeName") for p in pods)

    return check


async def _wait_bound(api: fleet.KubeApi, ns: str, expected: int, timeout_s: float) -> list[dict]:
    last: list[dict] = []

    async def bound() -> bool:
        nonlocal last
        last = await _pods(api, ns)
        return _all_bound(expected)(last)

    try:
        await eventually(bound, timeout_s=timeout_s, step_s=0.5, what=f"{expected} pods bound in {ns}")
    except AssertionError:
        pending = [p["metadata"]["name"] for p in last if not p["spec"].get("nodeName")]
        raise AssertionError(f"{len(pending)} of {len(last)} pods in {ns} not bound: {pending[:10]}") from None
    return last


def _burst(ns: str, n: int, seed: int, selector: dict[str, str]) -> list[dict]:
    """Mixed pods: 95 % one-GPU shares (5-20 GiB, 10-25 % of compute), 5 % two whole GPUs (a share can only
    be asked for on one GPU). Expected load: 0.95 x 17.5 % + 0.05 x 200 % = about 27 % of the GPUs."""
    rng = random.Random(seed)
    pods = []
    for i in range(n):
        if rng.random() < 0.05:
            pods.append(fleet.share_pod(f"pair-{i:03d}", ns, memory_mib=None, cores=100, gpus=2,
                                        node_selector=selector))
        else:
            pods.append(fleet.share_pod(
                f"share-{i:03d}", ns, memory_mib=rng.choice([5120, 10240, 20480]),
                cores=rng.choice([10, 15, 20, 25]), node_selector=selector,
            ))
    return pods


async def test_200_share_pods_on_20_nodes_through_the_real_kube_scheduler(
    api: fleet.KubeApi, extender: Extender, kube_scheduler: object
) -> None:
    ns, group = "e2e-burst", {"e2e/group": "burst"}
    await api.ensure_namespace(ns)
    nodes = [fleet.gpu_node(f"e2e-burst-{i:02d}", gpus=4, labels=group) for i in range(20)]
    await fleet.create_nodes(api, nodes)
    # 200 pods over 80 GPUs: about 22 GPUs' worth of compute (see _burst).
    share = _burst(ns, 200, seed=7, selector=group)
    plain = [fleet.plain_pod(f"plain-{i:02d}", ns, scheduler="gpupool-scheduler", node_selector=group)
             for i in range(10)] + [fleet.plain_pod(f"default-{i:02d}", ns, node_selector=group) for i in range(10)]
    async with fleet.StatusKubelet(api, nodes={n["metadata"]["name"] for n in nodes}, namespace=ns) as kubelet:
        await _create_all(api, share + plain)
        pods = await _wait_bound(api, ns, len(share) + len(plain), timeout_s=420)
        assert kubelet.failures == {}
    node_objs = await api.list_nodes("e2e/group=burst")
    assert allocation_problems(pods, node_objs) == []
    by_name = {p["metadata"]["name"]: p for p in pods}
    for p in plain:  # scheduled untouched: no allocation, no other gpupool annotation
        got = by_name[p["metadata"]["name"]]
        assert not any(k.startswith("gpupool.io/") for k in got["metadata"].get("annotations") or {})
    gpu_pods = [by_name[p["metadata"]["name"]] for p in share]
    assert all(ANN_ALLOCATION in p["metadata"]["annotations"] for p in gpu_pods)
    # The extender's ledger agrees with what the API server holds.
    ledger = extender.ledger()
    assert ledger["diff"] == {"missing": [], "extra": [], "different": [], "overcommitted": []}


async def test_extender_killed_during_a_burst_loses_and_doubles_nothing(
    api: fleet.KubeApi, extender: Extender, kube_scheduler: object
) -> None:
    ns, group = "e2e-restart", {"e2e/group": "restart"}
    await api.ensure_namespace(ns)
    nodes = [fleet.gpu_node(f"e2e-restart-{i:02d}", gpus=4, labels=group) for i in range(8)]
    await fleet.create_nodes(api, nodes)
    pods = _burst(ns, 60, seed=11, selector=group)  # about 16 of the 32 GPUs' worth
    async with fleet.StatusKubelet(api, nodes={n["metadata"]["name"] for n in nodes}, namespace=ns):
        creating = asyncio.create_task(_create_all(api, pods, parallel=4))

        async def some_bound() -> bool:
            return sum(1 for p in await _pods(api, ns) if p["spec"].get("nodeName")) >= 15

        await eventually(some_bound, timeout_s=120, what="first binds")
        extender.kill()  # mid-burst: binds in flight die with the process
        await asyncio.sleep(1.0)
        extender.start()
        await asyncio.to_thread(extender.wait_ready)
        await creating
        bound = await _wait_bound(api, ns, len(pods), timeout_s=420)
    assert allocation_problems(bound, await api.list_nodes("e2e/group=restart")) == []
    # Nothing doubled: one Binding per pod (spec.nodeName is set once), one allocation per pod, and the new
    # process rebuilt exactly the API's allocations.
    ledger = extender.ledger()
    assert ledger["diff"] == {"missing": [], "extra": [], "different": [], "overcommitted": []}
    uids = {p["metadata"]["uid"] for p in bound}
    entries = [e for e in ledger["ledger"]["entries"] if e["uid"] in uids]
    assert len(entries) == len(pods) and {e["state"] for e in entries} == {"confirmed"}


async def test_extender_refuses_to_bind_a_recreated_pod(api: fleet.KubeApi, extender: Extender) -> None:
    """A bind for a pod UID that no longer exists (same name, re-created) must not bind the new pod. The
    1.20 API server does not check a Binding's metadata.uid, so the extender's own check is what holds."""
    ns = "e2e-recreated"
    await api.ensure_namespace(ns)
    node = fleet.gpu_node("e2e-recreated-0", gpus=1, labels={"e2e/group": "recreated"})
    await fleet.create_node(api, node)
    spec = fleet.share_pod("again", ns, scheduler="e2e-nobody", node_selector={"e2e/group": "recreated"})
    old = await api.create_pod(spec)
    await api.delete(f"/api/v1/namespaces/{ns}/pods/again")
    new = await api.create_pod(spec)
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    async with httpx.AsyncClient(base_url=extender.url, timeout=30) as http:
        r = await http.post("/bind", json={"PodName": "again", "PodNamespace": ns, "PodUID": old["metadata"]["uid"],
                                           "Node": "e2e-recreated-0"})
    assert r.status_code == 200 and "was re-created" in r.json()["Error"]
    assert not (await api.get(f"/api/v1/namespaces/{ns}/pods/again"))["spec"].get("nodeName")
