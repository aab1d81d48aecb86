"""The demo's scheduler serves the pool views: /pool (snapshot JSON), /metrics with pool series, /ui."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpupool.commands.pool_views import pool_views
from gpupool.demo.embedded import load_scenario, start_embedded, workload_pods
from gpupool.demo.kube_scheduler import KubeSchedulerDriver
from gpupool.scheduler.ledger import Ledger


async def confirmed(ledger: Ledger, timeout_s: float = 30.0) -> None:
    """Until the watch has shown every bound pod to the ledger (its entries no longer assumed)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while any(e.assumed for e in ledger.entries.values()):
        assert asyncio.get_running_loop().time() < deadline, "binds not confirmed by the watch"
        await asyncio.sleep(0.01)


async def test_pool_views_follow_the_ledger() -> None:
    scenario = load_scenario().scaled(6)
    emb = await start_embedded(scenario, extra_routes=pool_views())
    driver = KubeSchedulerDriver(emb.url, emb.cluster, emb.node_names, seed=1)
    try:
        pods = workload_pods(scenario, 12)
        stats = await driver.run(pods)
        assert stats.bound > 0
        await confirmed(emb.service.ledger)
        async with httpx.AsyncClient(base_url=emb.url, timeout=30) as client:
            snap = (await client.get("/pool")).json()
            grants = [g for n in snap["nodes"] for gpu in n["gpus"] for g in gpu["grants"]]
            # Every pod holding capacity in the ledger is listed once, by its namespace/name ...
            ledger_keys = sorted(e.key for e in emb.service.ledger.entries.values())
            assert sorted({f"{g['namespace']}/{g['pod']}" for g in grants}) == ledger_keys
            # ... with the container that asks for its GPUs (the workload's pods have one, "main").
            assert {g["container"] for g in grants} == {"main"}
            text = (await client.get("/metrics")).text
            names = {f.name for f in text_string_to_metric_families(text)}
            assert any(n.startswith("gpupool_grant") for n in names)
            assert any(n.startswith("gpupool_extender") for n in names)  # the scheduler's own series stay
            page = await client.get("/ui/")
            assert page.status_code == 200 and grants[0]["pod"] in page.text
    finally:
        await driver.close()  # its keep-alive connections, else a ResourceWarning in whichever test GCs them
        await emb.stop()


async def test_a_pod_that_fits_nowhere_is_listed_as_pending_with_its_reason() -> None:
    scenario = load_scenario().scaled(2)
    emb = await start_embedded(scenario, extra_routes=pool_views())
    driver = KubeSchedulerDriver(emb.url, emb.cluster, emb.node_names, seed=1)
    try:
        pod = workload_pods(scenario, 1)[0]
        pod["spec"]["containers"][0]["resources"]["limits"]["gpupool.io/gpu"] = "64"  # no node has 64 GPUs
        for key in ("gpupool.io/gpu-cores", "gpupool.io/gpu-memory"):
            pod["spec"]["containers"][0]["resources"]["limits"].pop(key, None)
        stats = await driver.run([pod])
        assert stats.bound == 0
        async with httpx.AsyncClient(base_url=emb.url, timeout=30) as client:
            snap = (await client.get("/pool")).json()
        pending = snap["pending"]
        assert len(pending) == 1 and "64" in str(pending[0]) and "fits no node" in str(pending[0])
    finally:
        await driver.close()  # its keep-alive connections, else a ResourceWarning in whichever test GCs them
        await emb.stop()
