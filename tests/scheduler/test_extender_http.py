"""The extender over real HTTP (uvicorn on 127.0.0.1, httpx client): protocol shapes and bad input."""

from __future__ import annotations

import json

from gpupool.api.names import ANN_ALLOCATION
from tests.scheduler.conftest import decided, gpu_pod, plain_pod


async def _create(emb, pod):
    return await emb.cluster.create_pod(pod)


async def _cpu_node(emb, name: str = "cpu-only-node") -> str:
    await emb.cluster.create_node({"metadata": {"name": name}, "status": {"allocatable": {"cpu": "8"}}})
    return name


async def test_filter_node_cache_capable_returns_feasible_names_and_reasons(listing, client):
    pod = await _create(listing, gpu_pod("p", cores=50, memory=4096))
    rejected = [await _cpu_node(listing), "no-such-node"]
    r = await client.post(f"{listing.url}/filter",
                          json={"Pod": pod, "NodeNames": listing.node_names + rejected, "Nodes": None})
    assert r.status_code == 200
    body = r.json()
    assert set(body) >= {"NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    # kube-scheduler reads reasons only when no node is left: none are sent while one is.
    assert body["NodeNames"] == listing.node_names and body["FailedAndUnresolvableNodes"] == {}
    assert body["Error"] == ""
    body = (await client.post(f"{listing.url}/filter", json={"Pod": pod, "NodeNames": rejected})).json()
    assert body["NodeNames"] == []
    assert "no gpupool inventory" in body["FailedAndUnresolvableNodes"]["cpu-only-node"]
    assert body["FailedAndUnresolvableNodes"]["no-such-node"] == "node no-such-node does not exist"


async def test_filter_full_node_objects_mode(listing, client):
    pod = await _create(listing, gpu_pod("p", cores=50))
    nodes, _ = await listing.cluster.list_nodes()
    r = await client.post(f"{listing.url}/filter", json={"Pod": pod, "Nodes": {"items": nodes}, "NodeNames": None})
    body = r.json()
    assert body["NodeNames"] is None
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == sorted(n["metadata"]["name"] for n in nodes)


async def test_filter_decides_in_full_node_objects_mode_too(embedded, client):
    pod = await _create(embedded, gpu_pod("p", cores=50))
    nodes, _ = await embedded.cluster.list_nodes()
    r = await client.post(f"{embedded.url}/filter", json={"Pod": pod, "Nodes": {"items": nodes}, "NodeNames": None})
    body = r.json()
    assert body["NodeNames"] is None and body["Error"] == ""
    kept = [n["metadata"]["name"] for n in body["Nodes"]["items"]]
    assert len(kept) == 1 and kept[0] in embedded.node_names


async def test_pod_without_gpupool_resources_passes_through(embedded, client):
    pod = await _create(embedded, plain_pod("web"))
    names = embedded.node_names + [await _cpu_node(embedded)]
    body = (await client.post(f"{embedded.url}/filter", json={"Pod": pod, "NodeNames": names})).json()
    assert body["NodeNames"] == names and body["FailedNodes"] == {}
    bind = {"PodName": "web", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "cpu-only-node"}
    assert (await client.post(f"{embedded.url}/bind", json=bind)).json()["Error"] == ""
    bound = await embedded.cluster.get_pod("default", "web")
    assert bound["spec"]["nodeName"] == "cpu-only-node"
    assert ANN_ALLOCATION not in bound["metadata"].get("annotations", {})


async def test_filter_rejects_a_full_node_with_a_reason(listing, client):
    # Fill gpu-0000 (8 GPUs) with whole-GPU pods, then ask for one more on it.
    node = listing.node_names[0]
    for i in range(8):
        pod = await _create(listing, gpu_pod(f"w{i}", cores=None))
        args = {"PodName": f"w{i}", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": node}
        assert (await client.post(f"{listing.url}/bind", json=args)).json()["Error"] == ""
    pod = await _create(listing, gpu_pod("extra", cores=10))
    body = (await client.post(f"{listing.url}/filter", json={"Pod": pod, "NodeNames": listing.node_names})).json()
    assert body["NodeNames"] == listing.node_names[1:] and body["FailedNodes"] == {}
    body = (await client.post(f"{listing.url}/filter", json={"Pod": pod, "NodeNames": [node]})).json()
    assert body["NodeNames"] == [] and "0 available" in body["FailedNodes"][node]
    # One share on the second node: an 8-GPU pod now fails on both nodes, each with its own count.
    share = await _create(listing, gpu_pod("share", cores=10))
    args = {"PodName": "share", "PodNamespace": "default", "PodUID": share["metadata"]["uid"],
            "Node": listing.node_names[1]}
    assert (await client.post(f"{listing.url}/bind", json=args)).json()["Error"] == ""
    big = await _create(listing, gpu_pod("big", cores=None, gpus=8))
    body = (await client.post(f"{listing.url}/filter", json={"Pod": big, "NodeNames": listing.node_names})).json()
    assert body["NodeNames"] == []
    assert body["FailedNodes"] == {
        listing.node_names[0]: "needs 8 x a whole free GPU; 0 available",
        listing.node_names[1]: "needs 8 x a whole free GPU; 7 available",
    }


async def test_prioritize_scores_are_in_extender_range_and_follow_the_policy(embedded, client):
    pod = await _create(embedded, gpu_pod("p", cores=30, annotations={"gpupool.io/policy": "firstfit"}))
    r = await client.post(f"{embedded.url}/prioritize", json={"Pod": pod, "NodeNames": embedded.node_names})
    scores = r.json()
    # firstfit scores every node alike; its tie-break (rank = name order) picks the first node,
    # which gets the maximum; nodes scoring 0 are omitted (kube-scheduler counts a missing host as 0).
    assert scores == [{"Host": embedded.node_names[0], "Score": 10}]
    random_pod = await _create(embedded, gpu_pod("r", cores=30, annotations={"gpupool.io/policy": "random"}))
    r = await client.post(f"{embedded.url}/prioritize", json={"Pod": random_pod, "NodeNames": embedded.node_names})
    scores = r.json()
    assert {h["Host"] for h in scores} <= set(embedded.node_names)
    assert all(0 < h["Score"] <= 10 for h in scores) and max(h["Score"] for h in scores) == 10


async def test_bad_input_gets_clear_errors_and_the_service_keeps_serving(embedded, client):
    url = embedded.url
    r = await client.post(f"{url}/filter", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "invalid ExtenderArgs" in r.json()["Error"]
    r = await client.post(f"{url}/filter", json={"NodeNames": []})
    assert r.status_code == 400 and "Pod" in r.json()["Error"]
    r = await client.post(f"{url}/bind", json={"PodName": "x"})
    assert r.status_code == 400 and "ExtenderBindingArgs" in r.json()["Error"]
    big = b"{" + b" " * (embedded.service.config.max_body_bytes + 10) + b"}"
    r = await client.post(f"{url}/filter", content=big)
    assert r.status_code == 413 and "limit" in r.json()["Error"]
    for name, cores, memory, expect in [
        ("too-much", 150, None, "between 1 and 100"),
        ("negative", 50, -100, "negative"),
    ]:
        pod = await _create(embedded, gpu_pod(name, cores=cores, memory=memory))
        body = (await client.post(f"{url}/filter", json={"Pod": pod, "NodeNames": embedded.node_names})).json()
        assert body["NodeNames"] == []
        reasons = body["FailedAndUnresolvableNodes"]
        assert set(reasons) == set(embedded.node_names)
        assert all(expect in why for why in reasons.values()), reasons
    pod = await _create(embedded, gpu_pod("ok", cores=20))
    body = (await client.post(f"{url}/filter", json={"Pod": pod, "NodeNames": embedded.node_names})).json()
    assert decided(body, embedded.node_names)
    assert (await client.get(f"{url}/healthz")).status_code == 200


async def test_unknown_policy_is_rejected_everywhere(embedded, client):
    pod = await _create(embedded, gpu_pod("p", annotations={"gpupool.io/policy": "nonsense"}))
    body = (await client.post(f"{embedded.url}/filter", json={"Pod": pod, "NodeNames": embedded.node_names})).json()
    # every node refused, each for this reason (an all() over no reasons would pass a silent fallback)
    assert body["NodeNames"] == [] and body["Error"] == ""
    reasons = body["FailedAndUnresolvableNodes"]
    assert set(reasons) == set(embedded.node_names), body
    assert all("unknown policy" in why and "nonsense" in why for why in reasons.values()), reasons
    r = await client.post(f"{embedded.url}/prioritize", json={"Pod": pod, "NodeNames": embedded.node_names})
    assert r.json() == [], r.text  # no node is scored for a policy that does not exist


async def test_readyz_metrics_and_debug_ledger(embedded, client):
    assert (await client.get(f"{embedded.url}/readyz")).status_code == 200
    pod = await _create(embedded, gpu_pod("p", cores=40, memory=2048))
    args = {"PodName": "p", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"],
            "Node": embedded.node_names[1]}
    assert (await client.post(f"{embedded.url}/bind", json=args)).json() == {"Error": ""}
    text = (await client.get(f"{embedded.url}/metrics")).text
    assert 'gpupool_binds_total{result="bound"} 1.0' in text
    assert 'gpupool_extender_requests_total{code="200",verb="bind"} 1.0' in text
    dump = json.loads((await client.get(f"{embedded.url}/debug/ledger")).text)
    assert dump["diff"] == {"missing": [], "extra": [], "different": [], "overcommitted": []}
    [entry] = dump["ledger"]["entries"]
    assert entry["pod"] == "default/p" and entry["node"] == embedded.node_names[1]
    assert entry["gpus"][0]["cores"] == 40 and entry["gpus"][0]["memory_mib"] == 2048


async def test_not_ready_before_sync():
    from gpupool.api.extender import ExtenderArgs
    from gpupool.cluster.memory import MemoryCluster
    from gpupool.scheduler.config import SchedulerConfig
    from gpupool.scheduler.service import ExtenderService

    svc = ExtenderService(MemoryCluster(), SchedulerConfig(leader_elect=False))
    assert not svc.ready
    result = (await svc.filter(ExtenderArgs(Pod=gpu_pod("p"), NodeNames=["a"])))
    assert result.NodeNames == [] and "not ready" in result.Error
