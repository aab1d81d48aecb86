"""The scheduler's /pool, /metrics and /ui over a mixed pool: a node's agent reports AMD cards, one of them in
CPX/NPS4 with a partition in use; the views show each card's vendor and runtime, the partitions from the
inventory, and each vendor's share."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpupool.api.inventory import MigInstanceDoc, decode_inventory
from gpupool.api.names import ANN_INVENTORY
from gpupool.cluster.port import NODES
from gpupool.commands.pool_views import partitions_of, pool_views
from gpupool.demo.embedded import load_scenario, start_embedded


async def test_an_amd_node_reaches_pool_metrics_and_dashboard() -> None:
    scenario = load_scenario().scaled(2)
    emb = await start_embedded(scenario, extra_routes=pool_views())
    try:
        name = emb.node_names[0]
        node = await emb.cluster.get_object(NODES, name)
        doc = decode_inventory(node["metadata"]["annotations"][ANN_INVENTORY])
        cpx = [MigInstanceDoc(profile="CPX/NPS4", start=k, used=k == 3) for k in range(8)]
        gpus = [g.model_copy(update={"model": "MI300X", "vendor": "amd", "memory_mib": 196608, "uuid": f"AMD-{g.index}",
                                     "mig": g.index == 0, "mig_instances": cpx if g.index == 0 else []})
                for g in doc.gpus]
        text = doc.model_copy(update={"gpus": gpus}).model_dump_json()
        await emb.cluster.patch_object(NODES, name, {"metadata": {"annotations": {ANN_INVENTORY: text}}})
        ledger = emb.service.ledger
        deadline = asyncio.get_running_loop().time() + 30
        while not any(g.vendor == "amd" for g in ledger.inventories.get(name, doc).gpus):
            assert asyncio.get_running_loop().time() < deadline, "the node's change never reached the ledger"
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=emb.url, timeout=30) as client:
            snap = (await client.get("/pool")).json()
            metrics = (await client.get("/metrics")).text
            page = (await client.get("/ui/")).text
        by_node = {n["name"]: n["gpus"] for n in snap["nodes"]}
        assert {(g["vendor"], g["runtime"], g["model"]) for g in by_node[name]} == {("amd", "rocm", "MI300X")}
        others = [g for n, gs in by_node.items() if n != name for g in gs]
        assert others and {(g["vendor"], g["runtime"]) for g in others} == {("nvidia", "cuda")}
        first = next(g for g in by_node[name] if g["index"] == 0)
        # CPX/NPS4 on an MI300X: 38 CUs and 24,576 MiB each; the agent says partition 3 is in use
        parts = [(p["profile"], p["start"], p["compute_units"], p["memory_mib"], p["used"])
                 for p in first["partitions"]]
        assert parts == [("CPX/NPS4", k, 38, 24576, k == 3) for k in range(8)]
        assert all(not g["partitions"] for g in by_node[name] if g["index"] != 0)
        vendors = {v["vendor"]: v for v in snap["totals"]["vendors"]}
        assert vendors["amd"]["gpus"] == len(doc.gpus) and vendors["amd"]["memory_mib"] == 196608 * len(doc.gpus)
        assert sum(v["gpus"] for v in vendors.values()) == snap["totals"]["gpus"]

        series = {s.name: s for f in text_string_to_metric_families(metrics) for s in f.samples
                  if s.name == "gpupool_gpu_partition_used" and s.labels["start"] == "3"}
        assert series["gpupool_gpu_partition_used"].labels["vendor"] == "amd"
        assert series["gpupool_gpu_partition_used"].value == 1
        assert 'data-vendor="amd"' in page and 'data-profile="CPX/NPS4"' in page
    finally:
        await emb.stop()


def test_partitions_of_reads_only_partitioned_cards() -> None:
    doc = decode_inventory(
        '{"node": "n", "gpus": [{"uuid": "A", "index": 0, "model": "MI300X", "memory_mib": 196608, "vendor": "amd",'
        ' "mig": true, "mig_instances": [{"profile": "DPX/NPS2", "start": 4, "used": true}]},'
        ' {"uuid": "B", "index": 1, "model": "Ascend910B", "memory_mib": 65536, "vendor": "ascend",'
        ' "mig_instances": [{"profile": "vir08", "start": 0}]}]}')
    # B lists an instance but is not in partition mode: the agent's `mig` flag decides
    assert partitions_of([doc]) == {"A": [("DPX/NPS2", 4, True)]}
