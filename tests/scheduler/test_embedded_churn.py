"""The demo's churn loop: pods finish and are replaced, and the ledger stays equal to the API view."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from gpupool.demo.embedded import PodShape, Scenario, Workload, churn, start_embedded, workload_pods
from gpupool.demo.kube_scheduler import KubeSchedulerDriver
from tests.scheduler.conftest import small_scenario
from tests.scheduler.test_bind_reliability import settle


async def all_running(emb: Any, count: int, timeout_s: float = 30.0) -> None:
    """Wait until `count` pods are bound and every bound pod is Running; fails saying which are not."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        pods, _ = await emb.cluster.list_pods()
        bound = [p for p in pods if p.get("spec", {}).get("nodeName")]
        waiting = [p["metadata"]["name"] for p in bound if (p.get("status") or {}).get("phase") != "Running"]
        if len(bound) == count and not waiting:
            return
        if loop.time() > deadline:
            raise AssertionError(f"{len(bound)} of {count} pods bound, not Running after {timeout_s:g} s: {waiting}")
        await asyncio.sleep(0.01)


async def test_churn_replaces_finished_pods_and_keeps_the_ledger_consistent():
    base = small_scenario()
    scenario = Scenario(name="churn", nodes=base.nodes,
                        workload=Workload(pods=10, mix=[PodShape(weight=1, gpu=1, cores=20)]))
    emb = await start_embedded(scenario)
    driver = KubeSchedulerDriver(emb.url, emb.cluster, emb.node_names)
    # The churn is stopped between two submissions, never inside one: cancelling an HTTP request mid-flight
    # can leave its socket to the garbage collector, a ResourceWarning in whichever test collects it.
    submitting = asyncio.Lock()

    async def submit(pods: list[dict[str, object]]) -> None:
        async with submitting:
            await driver.run(pods)

    try:
        await driver.run(workload_pods(scenario))
        assert driver.stats.bound == 10
        await all_running(emb, 10)  # the fake kubelet marks them Running: the churn ends Running pods only
        task = asyncio.create_task(churn(emb, submit, lifetime_s=0.1, first=10, period_s=0.05, seed=1))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while driver.stats.bound < 25 and loop.time() < deadline:
            await asyncio.sleep(0.05)
        async with submitting:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert driver.stats.bound >= 25  # the first 10 plus replacements
        pods, _ = await emb.cluster.list_pods()
        names = {p["metadata"]["name"] for p in pods}
        assert any(int(n.split("-")[1]) >= 10 for n in names)  # replacements exist
        assert not {f"job-{i:06d}" for i in range(10)} <= names  # some originals finished and were deleted
        assert await settle(emb.service) == {"missing": [], "extra": [], "different": [], "overcommitted": []}
    finally:
        await driver.close()
        await emb.stop()
