"""The extender's preempt verb over real HTTP: of kube-scheduler's proposed victims, gpupool keeps those that
free the pod's GPU share, drops nodes where they cannot, and never trusts the body's pods."""

from __future__ import annotations

import httpx

from tests.scheduler.conftest import gpu_pod


async def _bound(emb, client: httpx.AsyncClient, name: str, node: str, cores: int | None, priority: int) -> str:
    spec = gpu_pod(name, cores=cores)
    spec["spec"]["priority"] = priority
    pod = await emb.cluster.create_pod(spec)
    args = {"PodName": name, "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": node}
    assert (await client.post(f"{emb.url}/bind", json=args)).json()["Error"] == ""
    await emb.cluster.patch_pod_status("default", name, {"phase": "Running"})
    return str(pod["metadata"]["uid"])


def _meta(*uids: str) -> dict:
    return {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0}


async def test_only_victims_that_free_the_share_are_kept(embedded, client):
    node, other = embedded.node_names
    # gpu-0000 (8 GPUs): six whole-GPU pods, a 50 % share `s` (priority 1) alone on GPU 6 and a whole-GPU
    # pod `w` (priority 5) on GPU 7. The preemptor needs one whole GPU: either victim alone frees one.
    for i in range(6):
        await _bound(embedded, client, f"fill{i}", node, None, 9)
    s = await _bound(embedded, client, "s", node, 50, 1)
    w = await _bound(embedded, client, "w", node, None, 5)
    # On the other node one 10 % share: kube-scheduler proposes it, but the node has free GPUs anyway.
    x = await _bound(embedded, client, "x", other, 10, 0)
    preemptor = await embedded.cluster.create_pod(gpu_pod("high", cores=None))
    body = {"Pod": preemptor, "NodeNameToMetaVictims": {node: _meta(w, s), other: _meta(x)}}
    answer = (await client.post(f"{embedded.url}/preempt", json=body)).json()
    # Given back most costly first: `w` (priority 5) is not needed once `s` goes, so only `s` stays.
    assert answer["NodeNameToMetaVictims"][node] == _meta(s)
    # The other node fits without taking anything: no victim needed there, so it is not a preemption
    # candidate (kube-scheduler's filter would have placed the pod there).
    assert other not in answer["NodeNameToMetaVictims"]


async def test_nodes_where_the_victims_cannot_make_room_are_dropped(embedded, client):
    node, _ = embedded.node_names
    uids = [await _bound(embedded, client, f"half{i}", node, 50, 0) for i in range(8)]
    preemptor = await embedded.cluster.create_pod(gpu_pod("big", cores=None, gpus=2))
    # One half-GPU victim frees no whole GPU (its GPU keeps another half): two whole GPUs are impossible.
    body = {"Pod": preemptor, "NodeNameToMetaVictims": {node: _meta(uids[0])}}
    assert (await client.post(f"{embedded.url}/preempt", json=body)).json() == {"NodeNameToMetaVictims": {}}


async def test_a_forged_pod_gets_no_candidates(embedded, client):
    node, _ = embedded.node_names
    victim = await _bound(embedded, client, "v", node, None, 0)
    forged = gpu_pod("ghost", cores=None)
    forged["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
    body = {"Pod": forged, "NodeNameToMetaVictims": {node: _meta(victim)}}
    r = await client.post(f"{embedded.url}/preempt", json=body)
    assert r.status_code == 200 and r.json() == {"NodeNameToMetaVictims": {}}
    bad = await client.post(f"{embedded.url}/preempt", json={"NodeNameToMetaVictims": {}})
    assert bad.status_code == 400 and "ExtenderPreemptionArgs at Pod" in bad.json()["Error"]


async def test_nodes_with_budget_violations_are_not_offered(embedded, client):
    node, _ = embedded.node_names
    uids = [await _bound(embedded, client, f"w{i}", node, None, 0) for i in range(8)]
    preemptor = await embedded.cluster.create_pod(gpu_pod("high", cores=None))
    # kube-scheduler would delete the victim directly, past its PodDisruptionBudget: not through gpupool.
    guarded = {"Pods": [{"UID": uids[0]}], "NumPDBViolations": 1}
    body = {"Pod": preemptor, "NodeNameToMetaVictims": {node: guarded}}
    assert (await client.post(f"{embedded.url}/preempt", json=body)).json() == {"NodeNameToMetaVictims": {}}
    body = {"Pod": preemptor, "NodeNameToMetaVictims": {node: _meta(uids[0])}}
    assert (await client.post(f"{embedded.url}/preempt", json=body)).json()["NodeNameToMetaVictims"][node] == _meta(
        uids[0])
