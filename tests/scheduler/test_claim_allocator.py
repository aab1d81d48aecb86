"""gpupool as the allocator of its DRA claims (gpupool.scheduler.claims), on the in-memory cluster: gated pods
get their claims allocated by gpupool's policy against the one ledger, then lose their gate; what gpupool
does not decide is left to kube-scheduler."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.api.dra import ATTR_REMOTE_SERVER, DELETE_PROTECTION, DRIVER, SCHEDULING_GATE, TAINT_UNHEALTHY
from gpupool.api.inventory import encode_inventory
from gpupool.api.names import ANN_INVENTORY
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import DEVICE_CLASSES, RESOURCE_CLAIMS, RESOURCE_SLICES
from gpupool.demo.embedded import node_objects
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.service import ExtenderService
from tests.scheduler.conftest import small_scenario

CONFIG = SchedulerConfig(leader_elect=False, dra_placement=True)
NS = "team-dra"
GPU_MIB = 16384
NODES = ("gpu-0000", "gpu-0001")


def device_class(name: str, isolation: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
                     "config": [{"opaque": {"driver": DRIVER, "parameters": {
                         "apiVersion": f"{DRIVER}/v1", "kind": "GpuConfig", "isolation": isolation}}}]}}


def resource_slice(node: str, tainted: tuple[int, ...] = ()) -> dict[str, Any]:
    devices = [{"name": f"gpu-{i}", **({"taints": [{"key": TAINT_UNHEALTHY, "value": "xid-79", "effect": "NoSchedule"}]}
                                       if i in tainted else {})} for i in range(2)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                  "resourceSliceCount": 1}, "devices": devices}}


def claim(name: str, memory: str | None = "8Gi", cores: str | None = "50", cls: str = DRIVER,
          selectors: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    capacity = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
    exactly: dict[str, Any] = {"deviceClassName": cls}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    if selectors:
        exactly["selectors"] = selectors
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def gated_pod(name: str, claim_name: str, node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulingGates": [{"name": SCHEDULING_GATE}],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
        "containers": [{"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": spec}


def reporting(obj: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """The node with `fields` set on every GPU of its inventory (as its agent reports them)."""
    doc = json.loads(obj["metadata"]["annotations"][ANN_INVENTORY])
    for g in doc["gpus"]:
        g.update(fields)
    obj["metadata"]["annotations"][ANN_INVENTORY] = json.dumps(doc)
    return obj


async def setup(tainted: dict[str, tuple[int, ...]] | None = None,
                gpu_mib: int = GPU_MIB) -> tuple[MemoryCluster, ExtenderService]:
    """gpu-0000 and gpu-0001, 2 GPUs each, whose agents run an MPS daemon per GPU (claims of the MPS class,
    like pods with isolation mps, go only to GPUs whose daemon is up)."""
    cluster = MemoryCluster()
    for obj in node_objects(small_scenario(nodes=2, gpus=2, memory_mib=gpu_mib)):
        await cluster.create_node(reporting(obj, mps="up"))
    for node in NODES:
        await cluster.create_object(RESOURCE_SLICES, resource_slice(node, (tainted or {}).get(node, ())))
    await cluster.create_object(DEVICE_CLASSES, device_class(DRIVER, "hook"))
    await cluster.create_object(DEVICE_CLASSES, device_class(f"mps.{DRIVER}", "mps"))
    await cluster.create_object(DEVICE_CLASSES, {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                                 "metadata": {"name": "other.example.com"}, "spec": {}})
    svc = ExtenderService(cluster, CONFIG)
    await svc.start()
    return cluster, svc


async def until(check: Any, timeout: float = 10.0) -> Any:
    """Poll until `check()` returns something truthy; the timeout only prevents a hang."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = await check()
        if got:
            return got
        assert loop.time() < deadline, "not reached before the timeout"
        await asyncio.sleep(0.02)


async def run(cluster: MemoryCluster, *objs: tuple[dict[str, Any], dict[str, Any]]) -> None:
    for c, p in objs:
        await cluster.create_object(RESOURCE_CLAIMS, c)
        await cluster.create_pod(p)


async def allocation(cluster: MemoryCluster, name: str) -> dict[str, Any] | None:
    obj = await cluster.get_object(RESOURCE_CLAIMS, name, NS)
    got: dict[str, Any] | None = (obj.get("status") or {}).get("allocation")
    return got


async def burst_packs_two_per_gpu(cluster: MemoryCluster) -> None:
    """Eight gated pods with 8 GiB claims (c0..c7, p0..p7) on NODES' 16 GiB GPUs: all are ungated, and each
    GPU holds exactly two (each decision saw the ones before it)."""
    await run(cluster, *((claim(f"c{i}", "8Gi", "10"), gated_pod(f"p{i}", f"c{i}")) for i in range(8)))

    async def all_ungated() -> bool:
        return all([await ungated(cluster, f"p{i}") for i in range(8)])

    await until(all_ungated)
    placed: dict[tuple[str, str], int] = {}
    for i in range(8):
        got = await allocation(cluster, f"c{i}")
        assert got is not None
        r = got["devices"]["results"][0]
        placed[(r["pool"], r["device"])] = placed.get((r["pool"], r["device"]), 0) + 1
    assert placed == {(n, d): 2 for n in NODES for d in ("gpu-0", "gpu-1")}


async def ungated(cluster: MemoryCluster, name: str) -> bool:
    pod = await cluster.get_pod(NS, name)
    return not (pod.get("spec") or {}).get("schedulingGates")


async def test_a_gated_pods_claim_is_allocated_with_its_share_and_class_config_then_ungated() -> None:
    cluster, svc = await setup()
    try:
        await run(cluster, (claim("c1", "8Gi", "30", cls=f"mps.{DRIVER}"), gated_pod("p1", "c1")))
        await until(lambda: ungated(cluster, "p1"))
        got = await allocation(cluster, "c1")
        assert got is not None
        (result,) = got["devices"]["results"]
        assert (result["driver"], result["request"], result["consumedCapacity"]) == (
            DRIVER, "gpu", {"memory": "8192Mi", "cores": "30"})
        assert result["pool"] in NODES and result["device"] in ("gpu-0", "gpu-1") and len(result["shareID"]) == 36
        assert got["devices"]["config"] == [{"source": "FromClass", "requests": ["gpu"], "opaque": {
            "driver": DRIVER, "parameters": {"apiVersion": f"{DRIVER}/v1", "kind": "GpuConfig", "isolation": "mps"}}}]
        assert got["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [result["pool"]]
        stored = await cluster.get_object(RESOURCE_CLAIMS, "c1", NS)
        assert DELETE_PROTECTION in stored["metadata"]["finalizers"]
        # the ledger holds the claim's share where the allocation says (assumed, then confirmed by the watch)
        entry = svc.ledger.entries[stored["metadata"]["uid"]]
        grants = [(g.index, g.milli, g.memory_mib) for g in entry.allocation.grants]
        index = int(result["device"].removeprefix("gpu-"))
        assert (entry.claim, entry.allocation.node, grants) == (True, result["pool"], [(index, 300, 8192)])
    finally:
        await svc.stop()


async def test_a_burst_fills_every_gpu_exactly_and_the_next_claim_waits_with_a_reason() -> None:
    """Eight 8 GiB claims on 2 nodes x 2 GPUs x 16 GiB: each decision sees the ones before it, so each GPU
    gets exactly two; a ninth fits nowhere and keeps its gate, with an Event saying why."""
    cluster, svc = await setup()
    try:
        await burst_packs_two_per_gpu(cluster)
        await run(cluster, (claim("c8", "8Gi", "10"), gated_pod("p8", "c8")))

        async def told() -> list[str]:
            return [e["message"] for e in cluster.events
                    if e["involvedObject"]["name"] == "p8" and e["reason"] == "FailedScheduling"]

        (message,) = await until(told)
        # the framework's words, as for a pod (gpu_fit's reason on the node that passed the most checks)
        assert message == ("gpupool: claim team-dra/c8: fits no node, e.g. needs 1 x a GPU with 10 percent "
                           "compute and 8192 MiB free; 0 available"), message
        assert not await ungated(cluster, "p8") and await allocation(cluster, "c8") is None
    finally:
        await svc.stop()


async def test_tainted_devices_and_the_pods_node_selector_are_respected() -> None:
    cluster, svc = await setup(tainted={"gpu-0001": (0,)})
    try:
        await run(cluster, (claim("c1", "1Gi", "10"), gated_pod("p1", "c1", {"kubernetes.io/hostname": "gpu-0001"})))
        await until(lambda: ungated(cluster, "p1"))
        got = await allocation(cluster, "c1")
        assert got is not None
        assert [(r["pool"], r["device"]) for r in got["devices"]["results"]] == [("gpu-0001", "gpu-1")]
    finally:
        await svc.stop()


def with_affinity(pod: dict[str, Any], *terms: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}
    return pod


async def test_the_pods_required_node_affinity_is_respected() -> None:
    """Without affinity the first claim goes to gpu-0000 (the policy's pick on an empty cluster); a pod
    whose required affinity excludes that node gets a GPU of gpu-0001 instead, by a label expression or by
    the node's name (matchFields), and a pod whose affinity no node meets waits with the reason. Before
    the allocator read node affinity, kube-scheduler could never bind such a pod to the node chosen."""
    cluster, svc = await setup()
    try:
        not_0 = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-0000"]}]}
        by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-0001"]}]}
        nowhere = {"matchExpressions": [{"key": "no-such-label", "operator": "Exists"}]}
        await run(cluster, (claim("free", "1Gi", "10"), gated_pod("p-free", "free")))
        await until(lambda: ungated(cluster, "p-free"))
        free = await allocation(cluster, "free")
        assert free is not None and free["devices"]["results"][0]["pool"] == "gpu-0000"
        await run(cluster, (claim("a1", "1Gi", "10"), with_affinity(gated_pod("p-a1", "a1"), not_0)),
                  (claim("a2", "1Gi", "10"), with_affinity(gated_pod("p-a2", "a2"), by_name)),
                  (claim("a3", "1Gi", "10"), with_affinity(gated_pod("p-a3", "a3"), nowhere)))
        for name in ("a1", "a2"):
            await until(lambda name=name: ungated(cluster, f"p-{name}"))
            got = await allocation(cluster, name)
            assert got is not None and {r["pool"] for r in got["devices"]["results"]} == {"gpu-0001"}, name
        (message,) = await until(lambda: messages(cluster, "p-a3"))
        assert message == ("gpupool: claim team-dra/a3: fits no node, e.g. the pod may not run here (its "
                           "nodeSelector and node affinity, the nodes' taints)")
        assert await allocation(cluster, "a3") is None
    finally:
        await svc.stop()


async def test_a_pod_with_rules_about_other_pods_is_left_to_kube_scheduler() -> None:
    """Required pod anti-affinity (replicas kept apart) or a topology spread that may not be broken depends
    on every pod of the cluster: gpupool would pack the replicas' claims on one node and kube-scheduler
    would then refuse the pods there for ever. Such pods are ungated with their claims unallocated."""
    cluster, svc = await setup()
    try:
        apart = gated_pod("p-apart", "apart")
        apart["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "serve"}}, "topologyKey": "kubernetes.io/hostname"}]}}
        spread = gated_pod("p-spread", "spread")
        spread["spec"]["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                                        "whenUnsatisfiable": "DoNotSchedule"}]
        await run(cluster, (claim("apart", "1Gi", "10"), apart), (claim("spread", "1Gi", "10"), spread),
                  (claim("free", "1Gi", "10"), gated_pod("p-free", "free")))
        for pod in ("p-apart", "p-spread", "p-free"):
            await until(lambda pod=pod: ungated(cluster, pod))
        assert await allocation(cluster, "apart") is None and await allocation(cluster, "spread") is None
        assert await allocation(cluster, "free") is not None
        assert svc.claims.left == 2 and svc.claims.allocated == 1
    finally:
        await svc.stop()


async def test_what_gpupool_does_not_decide_is_left_to_kube_scheduler() -> None:
    cluster, svc = await setup()
    try:
        cel = [{"cel": {"expression": 'device.attributes["gpu.gpupool.io"].model == "H100"'}}]
        await run(cluster,
                  (claim("sel", selectors=cel), gated_pod("p-sel", "sel")),
                  (claim("other", cls="other.example.com"), gated_pod("p-other", "other")))
        for pod in ("p-sel", "p-other"):
            await until(lambda pod=pod: ungated(cluster, pod))
        assert await allocation(cluster, "sel") is None and await allocation(cluster, "other") is None
        assert svc.claims.left == 2 and svc.claims.allocated == 0
    finally:
        await svc.stop()


async def test_a_pod_whose_claim_does_not_exist_yet_waits_silently_then_goes() -> None:
    cluster, svc = await setup()
    try:
        await cluster.create_pod(gated_pod("early", "later"))
        await asyncio.sleep(0.2)  # several passes of the allocator
        assert not await ungated(cluster, "early")
        await cluster.create_object(RESOURCE_CLAIMS, claim("later"))
        await until(lambda: ungated(cluster, "early"))
        assert await allocation(cluster, "later") is not None
    finally:
        await svc.stop()


async def test_the_template_a_translated_pod_names_is_made_on_first_use() -> None:
    """The webhook points a device-plugin manifest at gpupool-<isolation>-<count>x<memory>-<cores>c; the
    allocator makes that template (the resourceclaim controller then makes the pod's claim from it)."""
    from gpupool.cluster.port import RESOURCE_CLAIM_TEMPLATES

    cluster, svc = await setup()
    try:
        pod = gated_pod("translated", "unused")
        pod["spec"]["resourceClaims"] = [{"name": "gpupool", "resourceClaimTemplateName": "gpupool-mps-1x2048mi-25c"}]
        await cluster.create_pod(pod)

        async def made() -> dict[str, Any] | None:
            try:
                return await cluster.get_object(RESOURCE_CLAIM_TEMPLATES, "gpupool-mps-1x2048mi-25c", NS)
            except Exception:
                return None

        template = await until(made)
        assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"] == {
            "deviceClassName": f"mps.{DRIVER}", "count": 1,
            "capacity": {"requests": {"memory": "2048Mi", "cores": "25"}}}
        assert not await ungated(cluster, "translated")  # its claim is not made yet (no resourceclaim controller here)
    finally:
        await svc.stop()


async def test_a_gpu_shared_by_as_many_claims_as_its_node_allows_is_passed_over() -> None:
    """Twelve small claims on 2 nodes x 2 GPUs with 10 shares per GPU (the nodes' split): the policy packs
    them, but never an eleventh on one GPU; every claim is allocated."""
    cluster, svc = await setup()
    try:
        split = int(svc.ledger.split[0])
        await run(cluster, *((claim(f"s{i}", "512Mi", "5"), gated_pod(f"q{i}", f"s{i}")) for i in range(split + 2)))

        async def all_ungated() -> bool:
            return all([await ungated(cluster, f"q{i}") for i in range(split + 2)])

        await until(all_ungated)
        per_gpu: dict[tuple[str, str], int] = {}
        for i in range(split + 2):
            got = await allocation(cluster, f"s{i}")
            assert got is not None
            r = got["devices"]["results"][0]
            per_gpu[(r["pool"], r["device"])] = per_gpu.get((r["pool"], r["device"]), 0) + 1
        assert sum(per_gpu.values()) == split + 2 and max(per_gpu.values()) == split
    finally:
        await svc.stop()


async def test_a_scheduler_without_dra_placement_leaves_gated_pods_alone() -> None:
    """Only the scheduler configured to place claims touches gated pods (one per cluster)."""
    cluster = MemoryCluster()
    for obj in node_objects(small_scenario(nodes=2, gpus=2)):
        await cluster.create_node(obj)
    await cluster.create_object(RESOURCE_SLICES, resource_slice("gpu-0000"))
    await cluster.create_object(DEVICE_CLASSES, device_class(DRIVER, "hook"))
    svc = ExtenderService(cluster, SchedulerConfig(leader_elect=False))
    await svc.start()
    try:
        await run(cluster, (claim("c1"), gated_pod("p1", "c1")))
        await asyncio.sleep(0.3)  # several passes an allocator would have made
        assert svc.claims is None and not await ungated(cluster, "p1") and await allocation(cluster, "c1") is None
    finally:
        await svc.stop()


async def test_an_oversubscribed_claim_holds_its_share_on_the_gpu_and_its_spill_in_the_nodes_memory() -> None:
    """A class with memoryOversubscription 1.5: an 8 GiB share holds 8192 MiB of its GPU (guaranteed) and
    4096 MiB of its node's memory (what it may spill), assumed and then confirmed alike."""
    cluster, svc = await setup()
    try:
        oversub = device_class(f"big.{DRIVER}", "hook")
        oversub["spec"]["config"][0]["opaque"]["parameters"]["memoryOversubscription"] = "1.5"
        await cluster.create_object(DEVICE_CLASSES, oversub)
        state = svc.ledger.state
        before = {n.name: int(state.mem_free[state.index[n.name]]) for n in state.nodes}
        await run(cluster, (claim("c1", "8Gi", "25", cls=f"big.{DRIVER}"), gated_pod("p1", "c1")))
        await until(lambda: ungated(cluster, "p1"))
        got = await allocation(cluster, "c1")
        assert got is not None
        node = got["devices"]["results"][0]["pool"]
        uid = (await cluster.get_object(RESOURCE_CLAIMS, "c1", NS))["metadata"]["uid"]
        entry = svc.ledger.entries[uid]
        assert ([g.memory_mib for g in entry.allocation.grants], entry.request.memory_mib) == ([8192], 4096)
        state = svc.ledger.state
        assert int(state.mem_free[state.index[node]]) == before[node] - 4096
    finally:
        await svc.stop()


async def test_a_device_that_recovers_wakes_the_pod_waiting_for_it_without_listing() -> None:
    """Both GPUs of gpu-0001 tainted: a pod pinned there waits. Its devices recovering (the slice watched,
    not listed) places it at once, long before the allocator's own retry (set to an hour here)."""
    cluster, svc = await setup(tainted={"gpu-0001": (0, 1)})
    try:
        assert svc.claims is not None
        svc.claims.retry_s = 3600.0
        await run(cluster, (claim("c1", "1Gi", "10"), gated_pod("p1", "c1", {"kubernetes.io/hostname": "gpu-0001"})))
        await until(lambda: _told(svc, "p1"))
        assert not await ungated(cluster, "p1")
        await cluster.patch_object(RESOURCE_SLICES, f"gpu-0001-{DRIVER}",
                                   {"spec": {"devices": resource_slice("gpu-0001")["spec"]["devices"]}})
        await until(lambda: ungated(cluster, "p1"))
        got = await allocation(cluster, "c1")
        assert got is not None and got["devices"]["results"][0]["pool"] == "gpu-0001"
    finally:
        await svc.stop()


async def _told(svc: ExtenderService, pod: str) -> bool:
    """The allocator has tried the pod and recorded why it waits."""
    assert svc.claims is not None
    return any(p["metadata"]["name"] == pod for uid, p in svc.claims.gated.items() if uid in svc.claims.told)


# --- MIG partitions --------------------------------------------------------------------------------------

MIG_CLASS = f"mig.{DRIVER}"


def mig_claim(name: str, profile: str) -> dict[str, Any]:
    return claim(name, None, None, cls=MIG_CLASS, selectors=[
        {"cel": {"expression": f'device.attributes["{DRIVER}"].profile == "{profile}"'}}])


async def mig_setup() -> tuple[MemoryCluster, ExtenderService]:
    """gpu-0000's two GPUs in MIG mode (A100-80GB geometry), published as the agent publishes them (their
    partitions and counter sets, api.dra.resource_slices); gpu-0001 keeps its shared GPUs."""
    from gpupool.api.dra import SliceDevice, resource_slices

    cluster, svc = await setup(gpu_mib=81920)
    node = await cluster.get_node("gpu-0000")
    await cluster.patch_node_annotations(
        "gpu-0000", {ANN_INVENTORY: reporting(node, mig=True)["metadata"]["annotations"][ANN_INVENTORY]})
    await until(lambda: _mig_known(svc))
    gpus = [SliceDevice(i, f"GPU-{i}", "A100-80GB", 81920, mig_capable=True, mig_mode=True) for i in range(2)]
    await cluster.delete_object(RESOURCE_SLICES, f"gpu-0000-{DRIVER}")
    for s in resource_slices("gpu-0000", "uid", gpus, "", 1):
        await cluster.create_object(RESOURCE_SLICES, s)
    mig = device_class(MIG_CLASS, "mig")
    await cluster.create_object(DEVICE_CLASSES, mig)
    return cluster, svc


async def _mig_known(svc: ExtenderService) -> bool:
    """The scheduler's MIG planning knows gpu-0000's GPUs in MIG mode (from its inventory)."""
    plugin = svc.claim_framework.plugin("mig_placement")
    return "gpu-0000" in plugin.layouts.nodes  # type: ignore[attr-defined]


async def test_mig_claims_get_the_partition_gpupools_mig_planning_chooses() -> None:
    """A 4g.40gb claim can only start at slice 0; a 3g.40gb claim then best fills the same GPU at slice 4
    (the other GPU stays whole for a 7g.80gb); that 7g.80gb claim gets the other GPU; a fourth claim of
    any size finds no room and waits with the reason."""
    cluster, svc = await mig_setup()
    try:
        got: dict[str, tuple[str, str]] = {}
        for name, profile in (("four", "4g.40gb"), ("three", "3g.40gb"), ("seven", "7g.80gb")):
            await run(cluster, (mig_claim(name, profile), gated_pod(f"p-{name}", name)))
            await until(lambda name=name: ungated(cluster, f"p-{name}"))  # type: ignore[misc]
            allocated = await allocation(cluster, name)
            assert allocated is not None
            (result,) = allocated["devices"]["results"]
            assert "consumedCapacity" not in result and "shareID" not in result  # a partition is the claim's own
            assert allocated["devices"]["config"][0]["opaque"]["parameters"]["isolation"] == "mig"
            got[name] = (result["pool"], result["device"])
        first = got["four"][1].split("-")[1]
        assert got["four"] == ("gpu-0000", f"gpu-{first}-4g40gb-0")
        assert got["three"] == ("gpu-0000", f"gpu-{first}-3g40gb-4")
        assert got["seven"] == ("gpu-0000", f"gpu-{1 - int(first)}-7g80gb-0")
        # the ledger holds each partition as its profile's share
        uid = (await cluster.get_object(RESOURCE_CLAIMS, "three", NS))["metadata"]["uid"]
        (grant,) = svc.ledger.entries[uid].allocation.grants
        assert (grant.mig is not None and grant.mig.profile, grant.milli) == ("3g.40gb", 428)
        await run(cluster, (mig_claim("more", "1g.10gb"), gated_pod("p-more", "more")))
        assert svc.claims is not None
        await until(lambda: _told(svc, "p-more"))
        assert not await ungated(cluster, "p-more") and await allocation(cluster, "more") is None
    finally:
        await svc.stop()


async def test_a_mig_claim_with_any_other_selector_is_left_to_kube_scheduler() -> None:
    cluster, svc = await mig_setup()
    try:
        memory = claim("c", None, None, cls=MIG_CLASS, selectors=[{"cel": {"expression":
                       f'device.capacity["{DRIVER}"].memory.compareTo(quantity("20Gi")) >= 0'}}])
        await run(cluster, (memory, gated_pod("p", "c")))
        await until(lambda: ungated(cluster, "p"))
        assert await allocation(cluster, "c") is None  # kube-scheduler's to allocate
        assert svc.claims is not None and svc.claims.left == 1
    finally:
        await svc.stop()


async def test_only_a_pools_newest_generation_counts() -> None:
    """gpu-0001's pool moved to generation 2 with GPU 1 only (GPU 0 gone from it), while a slice of
    generation 1 that still shows GPU 0 is listed: a claim pinned to gpu-0001 gets GPU 1, never GPU 0."""
    cluster, svc = await setup()
    try:
        newer = resource_slice("gpu-0001")
        newer["spec"]["devices"] = [d for d in newer["spec"]["devices"] if d["name"] == "gpu-1"]
        newer["spec"]["pool"] = {"name": "gpu-0001", "generation": 2, "resourceSliceCount": 1}
        newer["metadata"]["name"] = f"gpu-0001-{DRIVER}-new"
        await cluster.create_object(RESOURCE_SLICES, newer)
        pin = {"kubernetes.io/hostname": "gpu-0001"}
        await run(cluster, *((claim(f"c{k}", "1Gi", "10"), gated_pod(f"p{k}", f"c{k}", pin)) for k in range(3)))
        for k in range(3):
            await until(lambda k=k: ungated(cluster, f"p{k}"))  # type: ignore[misc]
            got = await allocation(cluster, f"c{k}")
            assert got is not None and [(r["pool"], r["device"]) for r in got["devices"]["results"]] == [
                ("gpu-0001", "gpu-1")]
    finally:
        await svc.stop()


# --- remote shares ---------------------------------------------------------------------------------------

REMOTE_CLASS = f"remote.{DRIVER}"
ZONE = "topology.kubernetes.io/zone"
NO_SCHEDULE = {"key": "dedicated", "value": "training", "effect": "NoSchedule"}


def served(obj: dict[str, Any], servers: tuple[int, ...]) -> dict[str, Any]:
    """The slice with the GPU server's address on the shared GPUs `servers` (as the agent publishes it)."""
    for d in obj["spec"]["devices"]:
        if int(d["name"].removeprefix("gpu-")) in servers:
            d["attributes"] = {"type": {"string": "gpu"}, ATTR_REMOTE_SERVER: {"string": "tcp:10.0.0.5:7070"}}
    return obj


def agent_node(name: str, labels: dict[str, str] | None = None, cpu: str = "16",
               inventory: bool = False) -> dict[str, Any]:
    """A node without GPUs whose agent runs (its pool has no device); `inventory`: the agent also wrote an
    inventory of no GPUs, so the ledger knows the node."""
    annotations = {ANN_INVENTORY: encode_inventory(name, [], 10)} if inventory else {}
    allocatable = {"cpu": cpu, "memory": "64Gi"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})},
                         "annotations": annotations},
            "status": {"capacity": dict(allocatable), "allocatable": allocatable}}


async def remote_setup(servers: dict[str, tuple[int, ...]], agents: tuple[dict[str, Any], ...] = (),
                       labels: dict[str, dict[str, str]] | None = None,
                       tainted: dict[str, tuple[int, ...]] | None = None,
                       node_taints: dict[str, list[dict[str, str]]] | None = None,
                       ) -> tuple[MemoryCluster, ExtenderService]:
    """gpu-0000 and gpu-0001 (2 GPUs of 16 GiB each, 1000 CPUs), their GPU servers serving the GPUs
    `servers` names, plus the GPU-less `agents`; the remote class besides the hook class."""
    cluster = MemoryCluster()
    for obj in node_objects(small_scenario(nodes=2, gpus=2, memory_mib=GPU_MIB)):
        name = obj["metadata"]["name"]
        obj["metadata"]["labels"].update((labels or {}).get(name, {}))
        if name in (node_taints or {}):
            obj["spec"] = {"taints": (node_taints or {})[name]}
        await cluster.create_node(obj)
        await cluster.create_object(RESOURCE_SLICES, served(resource_slice(name, (tainted or {}).get(name, ())),
                                                           servers.get(name, ())))
    for obj in agents:
        await cluster.create_node(obj)
        empty = resource_slice(obj["metadata"]["name"])
        empty["spec"]["devices"] = []
        await cluster.create_object(RESOURCE_SLICES, empty)
    await cluster.create_object(DEVICE_CLASSES, device_class(DRIVER, "hook"))
    await cluster.create_object(DEVICE_CLASSES, device_class(REMOTE_CLASS, "remote"))
    svc = ExtenderService(cluster, CONFIG)
    await svc.start()
    return cluster, svc


def remote_claim(name: str, memory: str | None = "1Gi", cores: str | None = "10", count: int = 1) -> dict[str, Any]:
    c = claim(name, memory, cores, cls=REMOTE_CLASS)
    if count != 1:
        c["spec"]["devices"]["requests"][0]["exactly"]["count"] = count
    return c


def remote_pod(name: str, claim_name: str, node_selector: dict[str, str] | None = None,
               cpu: str | None = None) -> dict[str, Any]:
    pod = gated_pod(name, claim_name, node_selector)
    if cpu is not None:
        pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu, "memory": "1Gi"}
    return pod


async def placed(cluster: MemoryCluster, claim_name: str) -> tuple[str, str, str]:
    """(the pool of the claim's device, the device, the node its pod may run on)."""
    got = await allocation(cluster, claim_name)
    assert got is not None
    (result,) = got["devices"]["results"]
    (term,) = got["nodeSelector"]["nodeSelectorTerms"]
    (node,) = term["matchFields"][0]["values"]
    return result["pool"], result["device"], node


async def until_ungated(cluster: MemoryCluster, pod: str) -> None:
    await until(lambda: ungated(cluster, pod))


async def messages(cluster: MemoryCluster, pod: str) -> list[str]:
    return [e["message"] for e in cluster.events
            if e["involvedObject"]["name"] == pod and e["reason"] == "FailedScheduling"]


async def test_a_remote_share_prefers_a_gpu_server_on_a_node_its_pod_may_run_on() -> None:
    """The pod may run on gpu-0001 or on the GPU-less cpu-0000; gpu-0000's server has room too. The share
    goes to gpu-0001's GPU with a server and the pod with it, the same node. That GPU is 0, then 1: the
    index the policy would take on its own cannot pass both."""
    for k in (0, 1):
        cluster, svc = await remote_setup({"gpu-0000": (0, 1), "gpu-0001": (k,)},
                                          agents=(agent_node("cpu-0000", {"team": "a"}),),
                                          labels={"gpu-0001": {"team": "a"}})
        try:
            await run(cluster, (remote_claim("c1"), remote_pod("p1", "c1", {"team": "a"})))
            await until_ungated(cluster, "p1")
            assert await placed(cluster, "c1") == ("gpu-0001", f"gpu-{k}", "gpu-0001")
            got = await allocation(cluster, "c1")
            assert got is not None and got["devices"]["config"][0]["opaque"]["parameters"]["isolation"] == "remote"
        finally:
            await svc.stop()


async def test_a_pod_pinned_to_a_gpu_less_node_gets_a_gpu_server_on_another_node() -> None:
    """cpu-0000 runs gpupool's agent but has no GPU (with or without an inventory of none): its pod's share
    is in gpu-0001's server, the allocation names gpu-0001's pool and device, and the pod's node."""
    for inventory in (False, True):
        cluster, svc = await remote_setup({"gpu-0001": (1,)}, agents=(agent_node("cpu-0000", inventory=inventory),))
        try:
            await run(cluster, (remote_claim("c1", "2Gi", "20"),
                                remote_pod("p1", "c1", {"kubernetes.io/hostname": "cpu-0000"})))
            await until_ungated(cluster, "p1")
            assert await placed(cluster, "c1") == ("gpu-0001", "gpu-1", "cpu-0000")
            got = await allocation(cluster, "c1")
            assert got is not None and got["devices"]["results"][0]["consumedCapacity"] == {
                "memory": "2048Mi", "cores": "20"}
        finally:
            await svc.stop()


async def test_a_remote_share_prefers_a_gpu_in_the_zone_of_its_pods_node() -> None:
    """The pod may run only on cpu-0000 (zone a); one GPU node is in zone a, the other in zone b, both with
    servers: the share goes to zone a's, whichever node that is (the policy's own choice cannot be right
    both times)."""
    for zone_a in NODES:
        labels = {n: {ZONE: "a" if n == zone_a else "b"} for n in NODES}
        cluster, svc = await remote_setup({n: (0, 1) for n in NODES}, labels=labels,
                                          agents=(agent_node("cpu-0000", {ZONE: "a"}),))
        try:
            await run(cluster, (remote_claim("c1"), remote_pod("p1", "c1", {"kubernetes.io/hostname": "cpu-0000"})))
            await until_ungated(cluster, "p1")
            pool, _, node = await placed(cluster, "c1")
            assert (pool, node) == (zone_a, "cpu-0000")
        finally:
            await svc.stop()


async def test_the_pod_goes_to_the_zone_of_the_only_gpu_server_then_to_the_node_with_most_cpu() -> None:
    """The pod may run on the GPU-less cpu-0000 (zone a, 32 CPUs), cpu-0001 (zone b, 8 CPUs) and cpu-0002
    (zone b, 16 CPUs), not on a GPU node; the only server is gpu-0001's, in zone b: the pod goes to zone b,
    to cpu-0002, its node with the most CPU, not to cpu-0000 (more CPU, but zone a)."""
    agents = (agent_node("cpu-0000", {ZONE: "a", "team": "x"}, cpu="32"),
              agent_node("cpu-0001", {ZONE: "b", "team": "x"}, cpu="8"),
              agent_node("cpu-0002", {ZONE: "b", "team": "x"}, cpu="16"))
    cluster, svc = await remote_setup({"gpu-0001": (0,)}, agents=agents,
                                      labels={"gpu-0000": {ZONE: "a"}, "gpu-0001": {ZONE: "b"}})
    try:
        await run(cluster, (remote_claim("c1"), remote_pod("p1", "c1", {"team": "x"}, cpu="4")))
        await until(lambda: ungated(cluster, "p1"))
        assert await placed(cluster, "c1") == ("gpu-0001", "gpu-0", "cpu-0002")
    finally:
        await svc.stop()


async def test_a_burst_of_remote_pods_spreads_as_their_cpu_fills_the_pod_nodes() -> None:
    """Three remote pods of 6 CPUs at once, pod nodes of 16 (cpu-0001) and 8 (cpu-0000) CPUs: the first two go
    to cpu-0001 (16, then 10 left), the third to cpu-0000 (8 against 4). Before the allocator held the pods'
    CPU on their nodes, all three went to cpu-0001, where kube-scheduler could run only two. Once the
    first claim is gone its pod's CPU is free again: a pod of 10 CPUs fits cpu-0001."""
    agents = (agent_node("cpu-0000", {"team": "x"}, cpu="8"), agent_node("cpu-0001", {"team": "x"}, cpu="16"))
    cluster, svc = await remote_setup({"gpu-0000": (0, 1)}, agents=agents)
    try:
        await run(cluster, *((remote_claim(f"c{i}"), remote_pod(f"p{i}", f"c{i}", {"team": "x"}, cpu="6"))
                             for i in (1, 2, 3)))
        nodes = []
        for i in (1, 2, 3):
            await until(lambda i=i: ungated(cluster, f"p{i}"))
            nodes.append((await placed(cluster, f"c{i}"))[2])
        assert nodes == ["cpu-0001", "cpu-0001", "cpu-0000"]
        uid = (await cluster.get_object(RESOURCE_CLAIMS, "c1", NS))["metadata"]["uid"]
        await cluster.patch_object(RESOURCE_CLAIMS, "c1", {"metadata": {"finalizers": None}}, namespace=NS)
        await cluster.delete_object(RESOURCE_CLAIMS, "c1", namespace=NS)

        async def forgotten() -> bool:
            return uid not in svc.ledger.entries

        await until(forgotten)
        await run(cluster, (remote_claim("c4"), remote_pod("p4", "c4", {"team": "x"}, cpu="10")))
        await until(lambda: ungated(cluster, "p4"))
        assert (await placed(cluster, "c4"))[2] == "cpu-0001"
    finally:
        await svc.stop()


async def test_the_pods_node_is_the_one_with_most_cpu_and_one_its_cpu_request_fits() -> None:
    """No zones: the pod goes to the node it may run on with the most CPU (cpu-0001, 16 CPUs, over
    cpu-0000's 8, which the name would pick); a pod asking for 24 CPUs fits on none of them and waits."""
    agents = (agent_node("cpu-0000", {"team": "x"}, cpu="8"), agent_node("cpu-0001", {"team": "x"}, cpu="16"))
    cluster, svc = await remote_setup({"gpu-0000": (0, 1)}, agents=agents)
    try:
        await run(cluster, (remote_claim("c1"), remote_pod("p1", "c1", {"team": "x"}, cpu="4")),
                  (remote_claim("c2"), remote_pod("p2", "c2", {"team": "x"}, cpu="24")))
        await until(lambda: ungated(cluster, "p1"))
        pool, _, node = await placed(cluster, "c1")
        assert (pool, node) == ("gpu-0000", "cpu-0001")
        (message,) = await until(lambda: messages(cluster, "p2"))
        assert message == ("gpupool: claim team-dra/c2: fits no node, e.g. no node that runs gpupool's agent can "
                           "take this pod (its nodeSelector and node affinity, the nodes' taints, its CPU and memory "
                           "requests)")
        assert not await ungated(cluster, "p2") and await allocation(cluster, "c2") is None
    finally:
        await svc.stop()


async def test_gpus_without_a_server_are_never_used_for_remote_shares() -> None:
    """Only gpu-0001's GPU 1 has a server: a whole-GPU remote claim gets it; the next one waits, though three
    GPUs without a server are free."""
    cluster, svc = await remote_setup({"gpu-0001": (1,)})
    try:
        await run(cluster, (remote_claim("c1", None, None), remote_pod("p1", "c1")))
        await until(lambda: ungated(cluster, "p1"))
        assert await placed(cluster, "c1") == ("gpu-0001", "gpu-1", "gpu-0001")
        await run(cluster, (remote_claim("c2", None, None), remote_pod("p2", "c2")))
        (message,) = await until(lambda: messages(cluster, "p2"))
        # gpu-0001's GPU 1 is taken; the other GPUs have no server (claim_devices' reason, on the node that
        # passed the most checks)
        assert message == ("gpupool: claim team-dra/c2: fits no node, e.g. needs 1 GPU(s), 0 of its devices fit "
                           "(GPU 0: no untainted device of gpupool's DRA driver for this claim)"), message
        assert not await ungated(cluster, "p2") and await allocation(cluster, "c2") is None
    finally:
        await svc.stop()


async def test_a_remote_share_avoids_tainted_devices_but_not_the_gpu_nodes_own_taints() -> None:
    """The pod runs on cpu-0000. gpu-0000's GPU 0 is tainted (unhealthy); gpu-0001 is a node the pod does not
    tolerate, but the pod does not run there: three whole-GPU claims get the three other GPUs, a fourth
    waits."""
    cluster, svc = await remote_setup({n: (0, 1) for n in NODES}, agents=(agent_node("cpu-0000"),),
                                      tainted={"gpu-0000": (0,)}, node_taints={"gpu-0001": [NO_SCHEDULE]})
    try:
        pin = {"kubernetes.io/hostname": "cpu-0000"}
        await run(cluster, *((remote_claim(f"c{k}", None, None), remote_pod(f"p{k}", f"c{k}", pin)) for k in range(4)))
        for k in range(3):
            await until(lambda k=k: ungated(cluster, f"p{k}"))  # type: ignore[misc]
        got = sorted([await placed(cluster, f"c{k}") for k in range(3)])
        assert got == [("gpu-0000", "gpu-1", "cpu-0000"), ("gpu-0001", "gpu-0", "cpu-0000"),
                       ("gpu-0001", "gpu-1", "cpu-0000")]
        await until(lambda: messages(cluster, "p3"))
        assert not await ungated(cluster, "p3") and await allocation(cluster, "c3") is None
    finally:
        await svc.stop()


async def test_a_remote_claim_of_two_gpus_waits_with_the_reason() -> None:
    cluster, svc = await remote_setup({n: (0, 1) for n in NODES})
    try:
        await run(cluster, (remote_claim("c1", None, None, count=2), remote_pod("p1", "c1")),
                  (remote_claim("c2", count=2), remote_pod("p2", "c2")))
        (two,) = await until(lambda: messages(cluster, "p1"))
        assert two == ("gpupool: claim team-dra/c1 asks for 2 GPUs of isolation remote: a remote share is served "
                       "by one GPU (the forwarding library reaches one GPU server); ask for count 1")
        # a share of two GPUs, of any isolation, meets the rule a pod meets first
        (shares,) = await until(lambda: messages(cluster, "p2"))
        assert shares == ("gpupool: claim team-dra/c2: invalid request: a share of a GPU can only be asked for one "
                          "GPU at a time (count must be 1)")
        for name in ("1", "2"):
            assert not await ungated(cluster, f"p{name}") and await allocation(cluster, f"c{name}") is None
    finally:
        await svc.stop()


async def test_a_remote_shares_oversubscription_spills_into_the_gpu_nodes_memory() -> None:
    """A class with memoryOversubscription 1.5: a 4 GiB remote share may spill 2 GiB more into managed memory,
    which lives in the GPU server's worker: the ledger holds those 2048 MiB of the GPU node's memory (and
    nothing of the pod's CPU), not of the pod's node."""
    cluster, svc = await remote_setup({"gpu-0000": (0, 1)}, agents=(agent_node("cpu-0000"),))
    try:
        oversub = device_class(f"remote-big.{DRIVER}", "remote")
        oversub["spec"]["config"][0]["opaque"]["parameters"]["memoryOversubscription"] = "1.5"
        await cluster.create_object(DEVICE_CLASSES, oversub)
        state = svc.ledger.state
        i = state.index["gpu-0000"]
        memory = int(state.mem_free[i])
        await run(cluster, (claim("c2", "4Gi", "10", cls=f"remote-big.{DRIVER}"),
                            remote_pod("p2", "c2", {"kubernetes.io/hostname": "cpu-0000"})))
        await until(lambda: ungated(cluster, "p2"))
        pool, _, node = await placed(cluster, "c2")
        uid = (await cluster.get_object(RESOURCE_CLAIMS, "c2", NS))["metadata"]["uid"]
        entry = svc.ledger.entries[uid]
        assert (pool, node, entry.allocation.node) == ("gpu-0000", "cpu-0000", "gpu-0000")
        assert (entry.request.cpu_milli, entry.request.memory_mib) == (0, 2048)
        assert int(state.mem_free[i]) == memory - 2048
    finally:
        await svc.stop()


async def test_the_ledger_holds_a_remote_share_on_the_gpu_node_without_the_pods_cpu() -> None:
    """A pod asking for 4 CPUs and 1 GiB runs on cpu-0000, its 4 GiB / 25 % share on gpu-0000's GPU: the
    ledger holds the share on gpu-0000 (assumed, then confirmed by the watch), and none of the pod's CPU
    or memory there."""
    cluster, svc = await remote_setup({"gpu-0000": (0, 1)}, agents=(agent_node("cpu-0000"),))
    try:
        state = svc.ledger.state
        i = state.index["gpu-0000"]
        cpu, memory = int(state.cpu_free[i]), int(state.mem_free[i])
        await run(cluster, (remote_claim("c1", "4Gi", "25"),
                            remote_pod("p1", "c1", {"kubernetes.io/hostname": "cpu-0000"}, cpu="4")))
        await until(lambda: ungated(cluster, "p1"))
        pool, device, node = await placed(cluster, "c1")
        uid = (await cluster.get_object(RESOURCE_CLAIMS, "c1", NS))["metadata"]["uid"]
        entry = svc.ledger.entries[uid]
        assert (pool, node, entry.claim, entry.allocation.node) == ("gpu-0000", "cpu-0000", True, "gpu-0000")
        assert [(g.index, g.milli, g.memory_mib) for g in entry.allocation.grants] == [
            (int(device.removeprefix("gpu-")), 250, 4096)]
        assert (entry.request.cpu_milli, entry.request.memory_mib) == (0, 0)
        assert (int(state.cpu_free[i]), int(state.mem_free[i])) == (cpu, memory)
        assert int(state.gpu_mem_free[i].sum()) == 2 * GPU_MIB - 4096
    finally:
        await svc.stop()


GPU_NODE_SHAPE = st.tuples(st.frozensets(st.integers(0, 1)),  # its GPUs with a server
                           st.frozensets(st.integers(0, 1)),  # its tainted GPUs
                           st.sampled_from([None, "a", "b"]),  # its zone
                           st.sampled_from(["x", "y"]),  # its team label
                           st.booleans())  # a NoSchedule taint the pod does not tolerate
AGENT_SHAPE = st.tuples(st.sampled_from([None, "a", "b"]), st.sampled_from(["x", "y"]))


async def _remote_scenario(gpu_nodes: list[tuple[frozenset[int], frozenset[int], str | None, str, bool]],
                           agents: list[tuple[str | None, str]], pinned: bool) -> None:
    def labels(zone: str | None, team: str) -> dict[str, str]:
        return {"team": team, **({ZONE: zone} if zone else {})}

    names = [f"cpu-{k:04d}" for k in range(len(agents))]
    cluster, svc = await remote_setup(
        {n: tuple(servers) for n, (servers, *_) in zip(NODES, gpu_nodes, strict=True)},
        agents=tuple(agent_node(n, labels(z, t)) for n, (z, t) in zip(names, agents, strict=True)),
        labels={n: labels(z, t) for n, (_, _, z, t, _) in zip(NODES, gpu_nodes, strict=True)},
        tainted={n: tuple(bad) for n, (_, bad, *_) in zip(NODES, gpu_nodes, strict=True)},
        node_taints={n: [NO_SCHEDULE] for n, (*_, hard) in zip(NODES, gpu_nodes, strict=True) if hard})
    try:
        # hand-computed from the shapes: where the pod may run, its CPU (a GPU node has 1000 CPUs, an agent
        # node 16), its zone; which GPUs have an untainted server
        cpu = {n: 1000 for n in NODES} | {n: 16 for n in names}
        zone = {n: z for n, (_, _, z, _, _) in zip(NODES, gpu_nodes, strict=True)} | {
            n: z for n, (z, _) in zip(names, agents, strict=True)}
        team = {n: t for n, (_, _, _, t, _) in zip(NODES, gpu_nodes, strict=True)} | {
            n: t for n, (_, t) in zip(names, agents, strict=True)}
        hard = {n for n, (*_, h) in zip(NODES, gpu_nodes, strict=True) if h}
        allowed = {n for n in cpu if n not in hard and (not pinned or team[n] == "x")}
        servers = {(n, i) for n, (ok, bad, *_) in zip(NODES, gpu_nodes, strict=True) for i in ok - bad}
        await run(cluster, (remote_claim("c1"), remote_pod("p1", "c1", {"team": "x"} if pinned else None)))
        if not (allowed and servers):
            await until(lambda: _told(svc, "p1"))
            assert not await ungated(cluster, "p1") and await allocation(cluster, "c1") is None
            return
        await until_ungated(cluster, "p1")
        pool, device, node = await placed(cluster, "c1")
        assert (pool, int(device.removeprefix("gpu-"))) in servers and node in allowed
        gpu_nodes_with_server = {n for n, _ in servers}
        zones = {zone[n] for n in allowed} - {None}
        if gpu_nodes_with_server & allowed:
            assert node == pool
            return
        if any(zone[n] in zones for n in gpu_nodes_with_server):
            assert zone[pool] in zones
            candidates = {n for n in allowed if zone[n] == zone[pool]}
        else:
            candidates = allowed
        assert node == min(candidates, key=lambda n: (-cpu[n], n))
    finally:
        await svc.stop()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(GPU_NODE_SHAPE, min_size=2, max_size=2), st.lists(AGENT_SHAPE, max_size=2), st.booleans())
def test_a_remote_share_always_lands_on_a_gpu_server_and_its_pod_where_it_may_run(
        gpu_nodes: list[tuple[frozenset[int], frozenset[int], str | None, str, bool]],
        agents: list[tuple[str | None, str]], pinned: bool) -> None:
    """Any GPU nodes (servers, tainted GPUs, zones, labels, a taint the pod does not tolerate), any GPU-less
    agent nodes, a pod pinned by label or not, on an empty cluster: the share is on an untainted GPU with a
    server, the pod on a node it may run on, on the GPU's node when it may, else in the GPU's zone when a
    server is in one of its nodes' zones, on the node there with the most CPU; with no GPU server or no
    node for the pod, the claim waits."""
    asyncio.run(_remote_scenario(gpu_nodes, agents, pinned))
