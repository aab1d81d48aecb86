"""Property tests: after any sequence of binds, deletions, phase changes and restarts, the ledger equals the
recomputation from API objects, no GPU is over capacity, and a warm restart gives the same ledger."""

from __future__ import annotations

import asyncio
import contextlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.api.recompute import recompute
from gpupool.cluster.memory import MemoryCluster
from gpupool.demo.embedded import FakeKubelet, node_objects
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.ledger import Ledger
from gpupool.scheduler.service import ExtenderService
from tests.scheduler.conftest import gpu_pod, small_scenario
from tests.scheduler.test_bind_reliability import _args, assert_within_capacity, settle

CONFIG = SchedulerConfig(leader_elect=False, lock_wait_s=0.2)

op = st.one_of(
    st.tuples(st.just("create"), st.integers(1, 10), st.sampled_from([None, 1024, 4096, 12288])),
    st.tuples(st.just("create"), st.integers(1, 10), st.sampled_from([None, 1024, 4096, 12288])),
    st.tuples(st.just("bind"), st.integers(0, 30), st.integers(0, 1)),
    st.tuples(st.just("delete"), st.integers(0, 30), st.none()),
    st.tuples(st.just("succeed"), st.integers(0, 30), st.none()),
    st.tuples(st.just("restart"), st.none(), st.none()),
)


def _entries(ledger: Ledger) -> dict[str, tuple]:
    return {
        uid: (e.allocation.node, tuple((g.uuid, g.milli, g.memory_mib) for g in e.allocation.grants))
        for uid, e in ledger.entries.items()
    }


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
                pod = await cluster.create_pod(gpu_pod(f"p{len(pods)}", cores=a * 10, memory=b))
                pods.append(pod)
                await svc.bind(_args(pod, node=f"gpu-{a % 2:04d}"))  # most pods get bound right away
            elif kind == "bind" and pods:
                pod = pods[a % len(pods)]
                await svc.bind(_args(pod, node=f"gpu-{b:04d}"))
            elif kind == "delete" and pods:
                pod = pods[a % len(pods)]
                with contextlib.suppress(Exception):  # already gone
                    await cluster.delete_pod("default", pod["metadata"]["name"], uid=pod["metadata"]["uid"])
            elif kind == "succeed" and pods:
                pod = pods[a % len(pods)]
                with contextlib.suppress(Exception):
                    await cluster.patch_pod_status("default", pod["metadata"]["name"], {"phase": "Succeeded"})
            elif kind == "restart":
                await svc.stop()
                svc = ExtenderService(cluster, CONFIG)
                await svc.start()
            await asyncio.sleep(0)
        assert await settle(svc) == {"missing": [], "extra": [], "different": [], "overcommitted": []}
        nodes, _ = await cluster.list_nodes()
        api_pods, _ = await cluster.list_pods()
        assert_within_capacity(nodes, api_pods)
        assert set(svc.ledger.entries) == set(recompute(nodes, api_pods).allocations)
        before = _entries(svc.ledger)
        await svc.stop()
        svc = ExtenderService(cluster, CONFIG)
        await svc.start()
        assert _entries(svc.ledger) == before
    finally:
        await svc.stop()
        await kubelet.stop()
        await cluster.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=40))
def test_ledger_always_matches_the_api_and_survives_restart(ops):
    asyncio.run(_scenario(ops))
