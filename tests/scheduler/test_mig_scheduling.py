"""MIG pods through the extender's HTTP verbs (embedded cluster): placed on MIG-mode GPUs at the instance
core.mig_request / core.mig_placement choose, recorded in the allocation annotation, never two pods on
the same slices; other pods kept off MIG-mode GPUs.

Cluster: two nodes with two A100-40GB each (8 memory slices, 7 compute slices). The agent of gpu-0000
reports GPU 0 in MIG mode with a used 3g.20gb instance at slices 0-3 (so slices 4-7 are free); every
other GPU is a plain GPU."""

from __future__ import annotations

import json

import httpx
import pytest

from gpupool.api.allocation import decode_allocation
from gpupool.api.names import ANN_ALLOCATION, ANN_INVENTORY
from gpupool.demo.embedded import Embedded, NodeGroup, PodShape, Scenario, Workload, start_embedded
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.framework.plugins.mig import MigPlacement
from gpupool.scheduler.mig_layouts import MigState
from tests.scheduler.conftest import eventually, gpu_pod

MIG_NODE, PLAIN_NODE = "gpu-0000", "gpu-0001"


def mig_state(emb: Embedded) -> MigState:
    plugin = emb.service.framework.plugin("mig_placement")
    assert isinstance(plugin, MigPlacement)
    return plugin.state


def _scenario() -> Scenario:
    return Scenario(
        name="mig",
        nodes=[NodeGroup(prefix="gpu", count=2, model="A100-40GB", gpus=2, gpu_memory_mib=40960,
                         nvlink=False, cpu=1000, memory_gib=512)],
        workload=Workload(pods=0, mix=[PodShape(weight=1, gpu=1, cores=50)]),
    )


@pytest.fixture
async def mig_cluster():
    emb = await start_embedded(_scenario(), SchedulerConfig(port=0, leader_elect=False, lock_wait_s=2.0))
    node = await emb.cluster.get_node(MIG_NODE)
    doc = json.loads(node["metadata"]["annotations"][ANN_INVENTORY])
    doc["gpus"][0]["mig"] = True
    doc["gpus"][0]["mig_instances"] = [{"profile": "3g.20gb", "start": 0, "used": True, "uuid": "MIG-a"}]
    await emb.cluster.patch_node_annotations(MIG_NODE, {ANN_INVENTORY: json.dumps(doc)})
    await eventually(lambda: MIG_NODE in mig_state(emb).layouts.nodes)
    yield emb
    await emb.stop()


def mig_pod(name: str, cores: int | None = None, memory: int | None = None, profile: str | None = None,
            gpus: int = 1) -> dict:
    annotations = {"gpupool.io/isolation": "mig"}
    if profile:
        annotations["gpupool.io/mig-profile"] = profile
    return gpu_pod(name, cores=cores, memory=memory, gpus=gpus, annotations=annotations)


async def _filter(emb: Embedded, client: httpx.AsyncClient, pod: dict) -> dict:
    created = await emb.cluster.create_pod(pod)
    body = (await client.post(f"{emb.url}/filter", json={"Pod": created, "NodeNames": emb.node_names})).json()
    body["uid"] = created["metadata"]["uid"]
    return body


async def _why_not(emb: Embedded, client: httpx.AsyncClient, uid: str, node: str) -> str:
    """Why the pod does not fit `node` (offered alone: the extender gives reasons only when none is left)."""
    pod = next(p for p in (await emb.cluster.list_pods())[0] if p["metadata"]["uid"] == uid)
    body = (await client.post(f"{emb.url}/filter", json={"Pod": pod, "NodeNames": [node]})).json()
    assert body["NodeNames"] == []
    return str({**body["FailedNodes"], **body["FailedAndUnresolvableNodes"]}[node])


async def _bind(emb: Embedded, client: httpx.AsyncClient, name: str, uid: str, node: str) -> dict:
    args = {"PodName": name, "PodNamespace": "default", "PodUID": uid, "Node": node}
    assert (await client.post(f"{emb.url}/bind", json=args)).json()["Error"] == ""
    bound = await emb.cluster.get_pod("default", name)
    grant = decode_allocation(bound["metadata"]["annotations"][ANN_ALLOCATION]).model_dump(exclude_none=True)
    return dict(grant["gpus"][0])


async def test_mig_pods_get_disjoint_instances_recorded_in_the_allocation(mig_cluster, client):
    emb = mig_cluster
    # 25 % of the compute: 1g (1/7 = 14.3 %) is too small, 2g.10gb (2/7 = 28.6 %) the smallest that holds
    # it. 2g may start at slices 0, 2 or 4; 0-3 are the 3g's, so 4 is the only start left.
    first = await _filter(emb, client, mig_pod("two", cores=25))
    assert first["NodeNames"] == [MIG_NODE]
    assert await _why_not(emb, client, first["uid"], PLAIN_NODE) == "no GPU in MIG mode"
    grant = await _bind(emb, client, "two", first["uid"], MIG_NODE)
    # The grant is the profile's share: 1000 x 2 // 7 = 285 milli-GPU = 28.5 %, 2g.10gb's 9,850 MiB.
    assert grant == {"uuid": grant["uuid"], "index": 0, "memory_mib": 9850, "cores": 28.5,
                     "mig": {"profile": "2g.10gb", "start": 4}}
    # The agent has not reported the new instance yet: a 4,000 MiB pod (1g.5gb, the smallest by memory)
    # must not get slices 4-5 again; 1g.5gb may start at 0-6, so slice 6 is the one left for it.
    second = await _filter(emb, client, mig_pod("one", memory=4000))
    assert second["NodeNames"] == [MIG_NODE]
    grant = await _bind(emb, client, "one", second["uid"], MIG_NODE)
    assert grant["mig"] == {"profile": "1g.5gb", "start": 6} and grant["memory_mib"] == 4864
    # Slice 7 alone holds no 2g: a third 2g pod fits nowhere, and says why.
    third = await _filter(emb, client, mig_pod("again", cores=25))
    assert third["NodeNames"] == []
    assert third["FailedNodes"][MIG_NODE] == (
        "no GPU has an idle 2g.10gb instance or free slices at an allowed start for one")
    debug = (await client.get(f"{emb.url}/debug/ledger")).json()
    assert debug["diff"]["overcommitted"] == [] and debug["diff"]["different"] == []


async def test_named_profile_and_whole_gpu(mig_cluster, client):
    emb = mig_cluster
    # A named profile without a share asks for that instance, not for a free whole GPU: 4g.20gb may only
    # start at 0, which the 3g holds; 3g.20gb fits at 4.
    four = await _filter(emb, client, mig_pod("four", profile="4g.20gb"))
    assert four["NodeNames"] == []
    three = await _filter(emb, client, mig_pod("three", profile="3g.20gb"))
    assert three["NodeNames"] == [MIG_NODE]
    grant = await _bind(emb, client, "three", three["uid"], MIG_NODE)
    assert grant["mig"] == {"profile": "3g.20gb", "start": 4} and grant["cores"] == 42.8  # 1000 x 3 // 7
    # A profile of another model is refused with the reason.
    other = await _filter(emb, client, mig_pod("h100", profile="3g.40gb"))
    assert "MIG profile '3g.40gb' does not exist on A100-40GB" in other["FailedNodes"][MIG_NODE]


async def test_other_pods_stay_off_mig_gpus(mig_cluster, client):
    emb = mig_cluster
    # Two whole GPUs: gpu-0000 has only one GPU outside MIG mode.
    two = await _filter(emb, client, gpu_pod("pair", cores=None, gpus=2))
    assert two["NodeNames"] == [PLAIN_NODE]
    assert await _why_not(emb, client, two["uid"], MIG_NODE) == (
        "needs 2 GPU(s), 1 without MIG mode fit (GPU 0 in MIG mode serve only pods with gpupool.io/isolation: mig)")
    # A share on gpu-0000 goes to GPU 1, whatever the policy would have preferred.
    for k in range(3):
        share = await _filter(emb, client, gpu_pod(f"share{k}", cores=10))
        grant = await _bind(emb, client, f"share{k}", share["uid"], MIG_NODE)
        assert grant["index"] == 1 and "mig" not in grant


async def test_mig_asks_one_instance(mig_cluster, client):
    body = await _filter(mig_cluster, client, mig_pod("many", gpus=2))
    reason = body["FailedAndUnresolvableNodes"][MIG_NODE]
    assert "gpupool.io/gpu=2 with gpupool.io/isolation=mig: a pod gets one MIG instance" in reason
