"""The demo's scheduler serves the pool views: /pool (snapshot JSON), /metrics with pool series, /ui."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpupool.api.inventory import decode_inventory
from gpupool.api.names import ANN_INVENTORY
from gpupool.cluster.port import NODES
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


async def test_a_nodes_gpu_server_reaches_the_snapshot_from_its_inventory() -> None:
    """The agent writes its GPU server's address and the remote shares it serves into the node's inventory;
    the scheduler's snapshot (and so the dashboard) shows them for that node only."""
    scenario = load_scenario().scaled(2)
    emb = await start_embedded(scenario, extra_routes=pool_views())
    try:
        name = emb.node_names[0]
        node = await emb.cluster.get_object(NODES, name)
        doc = decode_inventory(node["metadata"]["annotations"][ANN_INVENTORY])
        text = doc.model_copy(update={"remote_server": "tcp:10.1.2.3:7070", "remote_shares": 3}).model_dump_json()
        await emb.cluster.patch_object(NODES, name, {"metadata": {"annotations": {ANN_INVENTORY: text}}})
        ledger = emb.service.ledger
        deadline = asyncio.get_running_loop().time() + 30
        while ledger.inventories.get(name, doc).remote_server != "tcp:10.1.2.3:7070":
            assert asyncio.get_running_loop().time() < deadline, "the node's change never reached the ledger"
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=emb.url, timeout=30) as client:
            snap = (await client.get("/pool")).json()
        servers = {n["name"]: (n["remote_server"], n["remote_shares"]) for n in snap["nodes"]}
        assert servers == {n: ("tcp:10.1.2.3:7070", 3) if n == name else ("", 0) for n in emb.node_names}
    finally:
        await emb.stop()
