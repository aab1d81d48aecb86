"""Claims are scheduled by the framework (issue 39, item 1): a gated pod's DRA claim is one framework cycle
under the claim profile, with the plugins a pod meets, so every rule holds for both forms.

- A team queue's maximum and its reclaim, the same test body run for a pod asking through `gpupool.io/*`
  limits and for a gated pod whose claim comes from the ResourceClaimTemplate the webhook names for the
  same share (`gpupool-hook-1xwhole-100c`, made by gpupool's scheduler on first use).
- A property: on the same cluster state the framework chooses for a claim the node and GPUs it chooses
  for the equivalent pod (or refuses both).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpupool.api.dra import DRIVER, SCHEDULING_GATE, ClaimAsk, template_for
from gpupool.api.extender import ExtenderArgs
from gpupool.api.names import ANN_INVENTORY, ANN_RUNTIME
from gpupool.api.queue import LABEL_QUEUE
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import CRDS, DEVICE_CLASSES, NAMESPACES, RESOURCE_CLAIMS, RESOURCE_SLICES
from gpupool.core.model import Allocation, GPURequest, PodRequest
from gpupool.demo.embedded import node_objects
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.framework.cycle import ClaimInCycle, Phase
from gpupool.scheduler.queues import GPUQUEUES
from gpupool.scheduler.service import ExtenderService
from tests.scheduler.conftest import QUEUE_CRD, bind_args, eventually, gpu_pod, reclaim, small_scenario
from tests.scheduler.test_claim_allocator import device_class, reporting, resource_slice

NODE = "gpu-0000"
WHOLE = "gpupool-hook-1xwhole-100c"  # the template the webhook names for `gpupool.io/gpu: 1` (api.dra)


async def service(queues: dict[str, dict[str, Any]]) -> ExtenderService:
    """One node with two whole GPUs of 16 GiB that serves both forms (inventory and ResourceSlice), the
    chart's GPUQueue CRD and `queues`; namespaces team-a and team-b join the queues of the same names."""
    cluster = MemoryCluster()
    for obj in node_objects(small_scenario(nodes=1, gpus=2)):
        await cluster.create_node(obj)
    await cluster.create_object(RESOURCE_SLICES, resource_slice(NODE))
    await cluster.create_object(DEVICE_CLASSES, device_class(DRIVER, "hook"))
    await cluster.create_object(CRDS, yaml.safe_load(QUEUE_CRD.read_text()))
    for team in ("team-a", "team-b"):
        await cluster.create_object(NAMESPACES, {"metadata": {"name": team, "labels": {LABEL_QUEUE: team}}})
    for name, spec in queues.items():
        await cluster.create_object(GPUQUEUES, {"metadata": {"name": name}, "spec": spec})
    svc = ExtenderService(cluster, SchedulerConfig(leader_elect=False, dra_placement=True))
    await svc.start()
    assert svc.claims is not None
    svc.claims.ready = lambda: False  # its own loop passes while not ready: the tests run each pass themselves
    await eventually(lambda: svc.queues.enabled and set(queues) <= set(svc.queues.queues.tree.specs)
                     and svc.queues.queue_of("team-b") == "team-b")
    return svc


# --- the two forms of one ask (a whole GPU) ------------------------------------------------------------------


class PodForm:
    """A pod asking `gpupool.io/gpu: 1`, placed through the extender (filter, then bind)."""

    async def create(self, svc: ExtenderService, name: str, namespace: str) -> dict[str, Any]:
        pod = await svc.cluster.create_pod(gpu_pod(name, cores=None, namespace=namespace))
        await eventually(lambda: svc.pods.get(pod["metadata"]["uid"]) is not None)
        return pod

    async def schedule(self, svc: ExtenderService, pod: dict[str, Any]) -> str | None:
        """One scheduling attempt: None when the pod got its GPU, else why not."""
        answer = await svc.filter(ExtenderArgs(Pod=pod, NodeNames=[NODE]))
        if not answer.NodeNames:
            return "; ".join([*answer.FailedNodes.values(), *answer.FailedAndUnresolvableNodes.values()])
        bound = await svc.bind(bind_args(pod))
        return bound.Error or None

    async def holder(self, svc: ExtenderService, pod: dict[str, Any]) -> str:
        """The UID the ledger holds the pod's GPU under."""
        return str(pod["metadata"]["uid"])


class ClaimForm:
    """The same ask as a claim: a gated pod whose claim the resourceclaim controller makes from the template
    (emulated here: the claim from the template's spec, its name in the pod's status), placed by the claim
    allocator (one pass)."""

    async def create(self, svc: ExtenderService, name: str, namespace: str,
                     node_selector: dict[str, str] | None = None) -> dict[str, Any]:
        cluster = svc.cluster
        template = template_for(WHOLE, namespace)
        assert template is not None
        pod = await cluster.create_pod({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"schedulingGates": [{"name": SCHEDULING_GATE}], "nodeSelector": dict(node_selector or {}),
                     "resourceClaims": [{"name": "gpupool", "resourceClaimTemplateName": WHOLE}],
                     "containers": [{"name": "main", "image": "x", "resources": {"claims": [{"name": "gpupool"}]}}]}})
        claim = await cluster.create_object(RESOURCE_CLAIMS, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"{name}-gpupool", "namespace": namespace,
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name,
                                              "uid": pod["metadata"]["uid"]}]},
            "spec": template["spec"]["spec"]})
        pod = await cluster.patch_pod_status(namespace, name, {"resourceClaimStatuses": [
            {"name": "gpupool", "resourceClaimName": claim["metadata"]["name"]}]})
        allocator = svc.claims
        assert allocator is not None
        uid = pod["metadata"]["uid"]

        def seen() -> bool:
            """The allocator knows the pod with its claim's name, and the claim."""
            gated = allocator.gated.get(uid)
            named = gated is not None and "resourceClaimStatuses" in (gated.get("status") or {})
            return named and f"{namespace}/{name}-gpupool" in allocator.claims

        await eventually(seen)
        return pod

    async def schedule(self, svc: ExtenderService, pod: dict[str, Any]) -> str | None:
        assert svc.claims is not None
        uid = pod["metadata"]["uid"]
        await svc.claims.pass_once()
        if uid not in svc.claims.gated:
            ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            stored = await svc.cluster.get_object(RESOURCE_CLAIMS, f"{name}-gpupool", ns)
            assert stored["status"]["allocation"]["devices"]["results"][0]["pool"] == NODE
            assert not (await svc.cluster.get_pod(ns, name))["spec"].get("schedulingGates")
            return None
        return svc.claims.told[uid]

    async def holder(self, svc: ExtenderService, pod: dict[str, Any]) -> str:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        return str((await svc.cluster.get_object(RESOURCE_CLAIMS, f"{name}-gpupool", ns))["metadata"]["uid"])


FORMS = {"pod": PodForm(), "claim": ClaimForm()}


async def running(svc: ExtenderService, form: PodForm | ClaimForm, name: str, namespace: str) -> dict[str, Any]:
    """A pod of `form` that got its GPU, bound and Running, its GPU confirmed in the ledger."""
    pod = await form.create(svc, name, namespace)
    assert await form.schedule(svc, pod) is None
    await svc.cluster.patch_pod_status(namespace, name, {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"})
    holder = await form.holder(svc, pod)
    await eventually(lambda: holder in svc.ledger.entries and not svc.ledger.entries[holder].assumed)
    return pod


@pytest.mark.parametrize("form", FORMS)
async def test_a_queue_at_its_maximum_is_refused_in_either_form(form: str) -> None:
    """team-a's maximum is 1 GPU and it runs one; the node has a second GPU free. A second GPU for team-a is
    refused with the queue's reason, and the pod is noted pending with it; the first was placed in the same
    form. Before claims were scheduled by the framework, the claim got the free GPU: 2 of 1."""
    svc = await service({"team-a": {"guaranteed": {"gpus": "1"}, "maximum": {"gpus": "1"}}})
    try:
        f = FORMS[form]
        await running(svc, f, "a1", "team-a")
        extra = await f.create(svc, "a2", "team-a")
        why = await f.schedule(svc, extra)
        assert why is not None and "queue team-a: 2 of 1 GPUs maximum" in why
        assert "queue team-a: 2 of 1 GPUs maximum" in svc.pending["team-a/a2"][0]
        assert await f.holder(svc, extra) not in svc.ledger.entries and len(svc.ledger.entries) == 1
        assert svc.queues.usage()["team-a"].gpu_milli == 1000  # one whole GPU, the first pod's
    finally:
        await svc.stop()


@pytest.mark.parametrize("form", FORMS)
async def test_a_borrowed_gpu_is_reclaimed_for_its_owner_in_either_form(form: str) -> None:
    """team-a runs two whole GPUs on the node (device-plugin pods), one of them team-b's idle guarantee.
    team-b's owner asks in `form`: the node is full, so the PostFilter evicts one of team-a's pods (both
    started at once with the same priority: either is the borrowed GPU), once; the owner then gets the GPU
    and team-a keeps its guarantee. Before, a claim never reclaimed anything and waited for ever."""
    svc = await service({"team-a": {"guaranteed": {"gpus": "1"}}, "team-b": {"guaranteed": {"gpus": "1"}}})
    try:
        f = FORMS[form]
        await running(svc, PodForm(), "a1", "team-a")
        await running(svc, PodForm(), "a2", "team-a")
        owner = await f.create(svc, "b1", "team-b")
        why = await f.schedule(svc, owner)
        assert why is not None and "0 available" in why  # no GPU free, for now
        (plan,) = reclaim(svc).plans
        assert len(plan.victims) == 1 and plan.victims[0].pod.queue == "team-a" and plan.victims[0].reason == "reclaim"
        victim = plan.victims[0].pod
        await eventually(lambda: svc.ledger.entries.get(victim.uid) is None)
        assert await f.schedule(svc, owner) is None
        kept = next(k for k in ("team-a/a1", "team-a/a2") if k != victim.key)
        holder = await f.holder(svc, owner)
        assert sorted(e.key for e in svc.ledger.entries.values()) == sorted([svc.ledger.entries[holder].key, kept])
        assert svc.ledger.entries[holder].allocation.node == NODE
        assert len(reclaim(svc).plans) == 1
    finally:
        await svc.stop()


async def test_nothing_is_reclaimed_for_a_claim_on_a_node_its_pod_may_not_run_on() -> None:
    """The reclaim test's cluster, the owner's pod pinned to another node by its nodeSelector: kube-scheduler
    would never offer gpu-0000 to it, so no pod there is evicted for it (a claim's node is gpupool's to
    rule out, as unresolvable), and the claim waits with the reason."""
    svc = await service({"team-a": {"guaranteed": {"gpus": "1"}}, "team-b": {"guaranteed": {"gpus": "1"}}})
    try:
        await running(svc, PodForm(), "a1", "team-a")
        await running(svc, PodForm(), "a2", "team-a")
        form = ClaimForm()
        owner = await form.create(svc, "b1", "team-b", node_selector={"kubernetes.io/hostname": "gpu-0009"})
        assert await form.schedule(svc, owner) == (
            "claim team-b/b1-gpupool: fits no node, e.g. the pod may not run here (its nodeSelector and node "
            "affinity, the nodes' taints)")
        assert reclaim(svc).plans == [] and sorted(e.key for e in svc.ledger.entries.values()) == [
            "team-a/a1", "team-a/a2"]
    finally:
        await svc.stop()


# --- the property ---------------------------------------------------------------------------------------------

NODES = [f"gpu-{k:04d}" for k in range(3)]
GPU_MIB = 16384
POLICIES = [None, "firstfit", "bestfit", "packing", "fgd", "gpupool"]  # deterministic ones (no random draw)


@dataclass(frozen=True)
class Ask:
    count: int
    whole: bool
    cores: int  # 0: a memory-only share
    memory_mib: int
    cpu: int  # the pod's CPU request, cores
    policy: str | None
    runtime: str | None = None  # gpupool.io/runtime (None: not said)


LOAD = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1), st.integers(1, 100), st.integers(1, GPU_MIB)),
                max_size=8)
ASKS = st.builds(Ask, count=st.integers(1, 2), whole=st.booleans(), cores=st.integers(0, 100),
                 memory_mib=st.integers(1, GPU_MIB), cpu=st.integers(0, 600), policy=st.sampled_from(POLICIES),
                 runtime=st.sampled_from([None, "cuda", "rocm", "any"]))


def pod_form(ask: Ask, uid: str) -> dict[str, Any]:
    """The pod asking `ask` through gpupool.io/* limits (a memory-only share names no gpu-cores)."""
    annotations = {"gpupool.io/policy": ask.policy} if ask.policy else {}
    if ask.runtime:
        annotations[ANN_RUNTIME] = ask.runtime
    pod = gpu_pod("as-pod", cores=None if ask.whole or not ask.cores else ask.cores,
                  memory=None if ask.whole else ask.memory_mib, gpus=ask.count, annotations=annotations)
    pod["metadata"]["uid"] = uid
    pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": str(ask.cpu)}
    return pod


def claim_form(ask: Ask, uid: str) -> dict[str, Any]:
    """The gated pod whose claim asks the same (its own CPU and policy as the pod's)."""
    pod = pod_form(ask, uid)
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": str(ask.cpu)}, "claims": [{"name": "gpu"}]}
    pod["spec"]["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    pod["spec"]["schedulerName"] = "default-scheduler"
    return pod


Choice = tuple[str, tuple[tuple[int, int, int], ...]] | None  # (node, (GPU index, milli, MiB) per grant)


async def _property(load: list[tuple[int, int, int, int]], soft: frozenset[int], ask: Ask,
                    amd: frozenset[int] = frozenset()) -> None:
    cluster = MemoryCluster()
    for k, obj in enumerate(node_objects(small_scenario(nodes=3, gpus=2, memory_mib=GPU_MIB))):
        if k in soft:  # kube-scheduler's preference, which gpupool's policy honours (prefer_no_schedule)
            obj["spec"] = {"taints": [{"key": "spot", "value": "yes", "effect": "PreferNoSchedule"}]}
        if k in amd:  # the node's cards are AMD's (its agent's inventory says so): rocm runs there, cuda not
            annotations = obj["metadata"]["annotations"]
            inventory = json.loads(annotations[ANN_INVENTORY])
            for gpu in inventory["gpus"]:
                gpu["vendor"] = "amd"
            annotations[ANN_INVENTORY] = json.dumps(inventory)
        await cluster.create_node(reporting(obj))
    svc = ExtenderService(cluster, SchedulerConfig(leader_elect=False))
    await svc.start()
    try:
        ledger, state = svc.ledger, svc.ledger.state
        for n, (k, j, cores, mib) in enumerate(load):  # GPUs other pods hold (each only where it fits)
            node = state.nodes[state.index[NODES[k]]]
            request = PodRequest(key=f"load-{n}", gpu=GPURequest(1, cores * 10, mib))
            grants = state.grants_for(state.index[NODES[k]], request, [j])
            ledger.assume(f"load-{n}", f"default/load-{n}", request, Allocation(f"load-{n}", node.name, grants),
                          svc.clock() + 3600)
        # the claim, scheduled under the claim profile (all devices published and untainted)
        cycle = svc.claim_framework.cycle(claim_form(ask, "claim-pod"), Phase.CLAIM)
        cycle.claim = ClaimInCycle("claim-uid", "default/c", ClaimAsk(
            "gpu", DRIVER, ask.count, None if ask.whole else ask.memory_mib, 0 if ask.whole else ask.cores),
            "hook", (), {n: frozenset({0, 1}) for n in NODES}, frozenset(NODES))
        status, node = await svc.claim_framework.place(cycle, NODES)
        for_claim: Choice = None
        if node is not None:
            assert cycle.allocation is not None and ledger.entries["claim-uid"].claim
            for_claim = (node, tuple((g.index, g.milli, g.memory_mib) for g in cycle.allocation.grants))
            await svc.claim_framework.unreserve(cycle, node)
        assert "claim-uid" not in ledger.entries
        # the pod, as kube-scheduler's prioritize call decides it (the extender's pick and reservation)
        fw = svc.framework
        pcycle = fw.cycle(pod_form(ask, "pod-uid"), Phase.PRIORITIZE)
        for_pod: Choice = None
        if fw.pre_filter(pcycle).ok:
            nodes = fw.filter(pcycle, NODES)
            if len(nodes):
                _, _, chosen = fw.select(pcycle, nodes)
                assert fw.reserve(pcycle, chosen).ok and pcycle.allocation is not None
                for_pod = (chosen, tuple((g.index, g.milli, g.memory_mib) for g in pcycle.allocation.grants))
        assert for_claim == for_pod, (status.reason, for_claim, for_pod)
    finally:
        await svc.stop()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(LOAD, st.frozensets(st.integers(0, 2)), ASKS, st.frozensets(st.integers(0, 2)))
@example([], frozenset(), Ask(1, False, 50, 1000, 0, None, "rocm"), frozenset())  # no card runs rocm
@example([], frozenset(), Ask(1, False, 50, 1000, 0, None, "rocm"), frozenset({2}))  # only the last node's
def test_the_framework_chooses_the_same_for_a_claim_as_for_the_equivalent_pod(
        load: list[tuple[int, int, int, int]], soft: frozenset[int], ask: Ask, amd: frozenset[int]) -> None:
    """Any load on 3 nodes x 2 GPUs of 16 GiB, any of them with a PreferNoSchedule taint, any of them AMD's,
    any ask (1 or 2 GPUs, whole or a share of cores and memory, memory-only, a CPU request, a placement
    policy, a runtime): the claim gets the node and GPUs (index, compute, memory) the pod would get, or both
    are refused. Before, a claim was placed by its own code, which did not weigh the taint (nor queues, nor
    busy nodes), and then without the pod's runtime."""
    asyncio.run(_property(load, soft, ask, amd))


def test_the_template_the_queue_tests_name_is_one_whole_gpu_under_hook() -> None:
    """What both forms of the queue tests ask: one GPU, no memory asked (the whole GPU), all its compute."""
    template = template_for(WHOLE, "team-a")
    assert template is not None
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"] == {"deviceClassName": DRIVER, "count": 1, "capacity": {"requests": {"cores": "100"}}}
