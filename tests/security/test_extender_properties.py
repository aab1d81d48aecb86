"""Property: whatever honest and forged callers send, in any order, with pods deleted meanwhile, no GPU is
allocated beyond its capacity or its pod limit, and no pod holds more (or less) than its API spec asks; the
ledger then equals the recomputation from the API."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.api.counted import Counted, beyond_spec
from gpupool.api.extender import ExtenderArgs, ExtenderBindingArgs
from gpupool.api.node_objects import nodes_from_objects
from gpupool.api.pod import parse_pod
from gpupool.api.recompute import recompute
from gpupool.cluster.memory import MemoryCluster
from gpupool.demo.embedded import SPLIT, FakeKubelet, node_objects
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.service import ExtenderService
from tests.scheduler.conftest import gpu_pod, small_scenario
from tests.scheduler.test_bind_reliability import assert_within_capacity, settle

CONFIG = SchedulerConfig(leader_elect=False, lock_wait_s=0.05)
NODES = ["gpu-0000", "gpu-0001", "no-such-node"]
CLEAN = {"missing": [], "extra": [], "different": [], "overcommitted": []}

# How a caller presents pod k: honestly, with inflated or deflated limits, as a pod that does not exist, or
# with another pod's UID.
VARIANTS = ("honest", "inflated", "deflated", "phantom", "other-uid")

op = st.one_of(
    st.tuples(st.just("create"), st.sampled_from([1, 5, 30, 60, 100]), st.sampled_from([None, 512, 4096, 12288])),
    st.tuples(st.sampled_from(["filter", "prioritize"]), st.integers(0, 20), st.sampled_from(VARIANTS)),
    st.tuples(st.just("bind"), st.integers(0, 20), st.tuples(st.integers(0, 2), st.sampled_from(VARIANTS))),
    st.tuples(st.just("delete"), st.integers(0, 20), st.none()),
)


def presented(pods: list[dict], k: int, variant: str) -> dict:
    pod = copy.deepcopy(pods[k % len(pods)])
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    if variant == "inflated":
        limits.update({"gpupool.io/gpu-cores": "100", "gpupool.io/gpu-memory": "16384"})
    elif variant == "deflated":
        limits.update({"gpupool.io/gpu-cores": "1", "gpupool.io/gpu-memory": "1"})
    elif variant == "phantom":
        pod["metadata"]["uid"] = str(uuid.uuid4())
    elif variant == "other-uid":
        pod["metadata"]["uid"] = pods[(k + 1) % len(pods)]["metadata"]["uid"]
    return pod


async def check_invariants(svc: ExtenderService, cluster: MemoryCluster) -> None:
    nodes, _ = await cluster.list_nodes()
    api_pods, _ = await cluster.list_pods()
    assert_within_capacity(nodes, api_pods)
    truth = recompute(nodes, api_pods)
    assert truth.overcommitted == {}, truth.overcommitted  # over capacity, beyond spec or over the pod limit
    # The ledger too, assumed entries (nominations, binds in flight) included: each holds what its pod's API
    # spec asks, and no GPU is shared by more than SPLIT pods.
    gpu_nodes = {n.name: n for n in nodes_from_objects(nodes)[0]}
    by_uid = {p["metadata"]["uid"]: p for p in api_pods}
    for uid, entry in svc.ledger.entries.items():
        if uid in by_uid:
            request = parse_pod(by_uid[uid]).request
            assert request is not None
            as_counted = Counted(uid, entry.key, request, entry.allocation)
            assert beyond_spec(as_counted, gpu_nodes[entry.allocation.node]) is None, entry
    assert int(svc.ledger.sharers.max(initial=0)) <= SPLIT


async def _scenario(ops: list[tuple]) -> None:
    cluster = MemoryCluster()
    for obj in node_objects(small_scenario(nodes=2, gpus=2)):
        await cluster.create_node(obj)
    kubelet = FakeKubelet(cluster)
    await kubelet.start()
    svc = ExtenderService(cluster, CONFIG)
    await svc.start()
    pods: list[dict] = []
    try:
        for kind, a, b in ops:
            if kind == "create":
                pods.append(await cluster.create_pod(gpu_pod(f"p{len(pods)}", cores=a, memory=b)))
            elif not pods:
                continue
            elif kind in ("filter", "prioritize"):
                args = ExtenderArgs(Pod=presented(pods, a, b), NodeNames=NODES[:2])
                await (svc.filter(args) if kind == "filter" else svc.prioritize(args))
            elif kind == "bind":
                node, variant = b
                pod = presented(pods, a, variant)
                m = pod["metadata"]
                await svc.bind(ExtenderBindingArgs(PodName=m["name"], PodNamespace=m["namespace"],
                                                   PodUID=m["uid"], Node=NODES[node]))
            elif kind == "delete":
                m = pods[a % len(pods)]["metadata"]
                with contextlib.suppress(Exception):  # already gone
                    await cluster.delete_pod("default", m["name"], uid=m["uid"])
            await asyncio.sleep(0)
            await check_invariants(svc, cluster)
        assert await settle(svc) == CLEAN
        await check_invariants(svc, cluster)
    finally:
        await svc.stop()
        await kubelet.stop()
        await cluster.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=30))
def test_honest_and_forged_callers_never_overcommit_nor_grant_beyond_the_spec(ops):
    asyncio.run(_scenario(ops))
