"""Claims as eviction victims and as preemptors, like pods (issue 39, item 1): a share a DRA claim holds is taken
by evicting the pods that use the claim, with their priority, queue and start, by the same rule that takes a
pod's share (gpupool.scheduler.framework.preemption.Evaluator.candidate).

- Priority preemption, the same body for a pod and a claim pod as preemptor and as victims: the cheapest share
  by core's rule (the lowest priority) goes, once, and the preemptor then gets its GPU.
- Reclaim from a queue that borrows through claims, the same body for both forms of borrower and owner.
- The negative cases: equal priority never evicts (one higher does); a pod whose PriorityClass does not
  preempt (`preemptionPolicy: Never`) takes nothing, the same pod with the default policy does.
- A claim shared by several pods is a victim only with all its pods: only when each is of lower priority,
  and then all of them go.
- The extender's preempt verb: a claim pod kube-scheduler proposes frees its claim's share.
- A property: on the same state the victims chosen when some shares are claims are the pods chosen when all
  are pods.

The embedded cluster has no resourceclaim controller: `collect` does what it does when a pod is gone (the
claim made from its template deleted, a shared claim's reservation dropped and, once no pod is left,
its allocation)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.api.allocation import encode_allocation
from gpupool.api.dra import DRIVER
from gpupool.api.extender import ExtenderPreemptionArgs, MetaPod, MetaVictims
from gpupool.api.names import ANN_ALLOCATION
from gpupool.api.queue import LABEL_QUEUE
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import CRDS, NAMESPACES, RESOURCE_CLAIMS, ClusterPort, NotFound
from gpupool.core.model import Allocation, GPUGrant
from gpupool.demo.embedded import node_objects
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.framework.cycle import Phase
from gpupool.scheduler.queues import GPUQUEUES
from gpupool.scheduler.service import ExtenderService
from tests.scheduler.conftest import QUEUE_CRD, eventually, gpu_pod, reclaim, small_scenario
from tests.scheduler.test_claims_framework import FORMS as BOTH
from tests.scheduler.test_claims_framework import NODE, ClaimForm, PodForm, running, service

FORMS: dict[str, PodForm | ClaimForm] = {name: form for name, form in BOTH.items()
                                          if isinstance(form, PodForm | ClaimForm)}

# --- what the embedded cluster lacks ---------------------------------------------------------------------


@contextlib.asynccontextmanager
async def priority_class(svc: ExtenderService, value: int, policy: str = "PreemptLowerPriority") -> AsyncIterator[None]:
    """Pods created meanwhile get `value` and `policy` as the API server's Priority admission gives a pod
    those of its PriorityClass (the embedded cluster has no admission)."""
    cluster = svc.cluster
    create_pod = cluster.create_pod

    async def admitted(obj: dict[str, Any]) -> dict[str, Any]:
        obj = {**obj, "spec": {**obj["spec"], "priority": value, "preemptionPolicy": policy}}
        return await create_pod(obj)

    cluster.create_pod = admitted  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        del cluster.create_pod


async def collect(cluster: ClusterPort) -> None:
    """What Kubernetes' resourceclaim controller does once pods are gone: a claim owned by a pod that no longer
    exists is deleted; a claim reserved for pods drops those that are gone, and is deallocated when none is
    left (a claim gpupool allocated carries its allocator's finalizer until it is deallocated)."""
    pods = {p["metadata"]["uid"] for p in (await cluster.list_pods())[0]}
    for claim in (await cluster.list_objects(RESOURCE_CLAIMS))[0]:
        meta = claim["metadata"]
        owners = [o["uid"] for o in meta.get("ownerReferences") or [] if o.get("kind") == "Pod"]
        if owners and not set(owners) & pods:  # deallocated, its allocator's finalizer removed, deleted
            released: dict[str, Any] = {"status": {"allocation": None, "reservedFor": []}}
            await cluster.patch_object(RESOURCE_CLAIMS, meta["name"], released, namespace=meta["namespace"],
                                       subresource="status")
            await cluster.patch_object(RESOURCE_CLAIMS, meta["name"], {"metadata": {"finalizers": None}},
                                       namespace=meta["namespace"])
            await cluster.delete_object(RESOURCE_CLAIMS, meta["name"], namespace=meta["namespace"])
            continue
        reserved = (claim.get("status") or {}).get("reservedFor") or []
        left = [r for r in reserved if r["uid"] in pods]
        if len(left) != len(reserved):
            status: dict[str, Any] = {"reservedFor": left}
            if not left:
                status["allocation"] = None
            await cluster.patch_object(RESOURCE_CLAIMS, meta["name"], {"status": status},
                                       namespace=meta["namespace"], subresource="status")


def events(svc: ExtenderService, namespace: str, name: str) -> list[tuple[str, str]]:
    return [(e["reason"], e["message"]) for e in svc.cluster.events  # type: ignore[attr-defined]
            if e["involvedObject"]["namespace"] == namespace and e["involvedObject"]["name"] == name]


async def gone(svc: ExtenderService, namespace: str, name: str) -> bool:
    try:
        await svc.cluster.get_pod(namespace, name)
    except NotFound:
        return True
    return False


LATER = "2026-01-01T01:00:00Z"  # `running` starts pods at 00:00: this one has run an hour less


async def start(svc: ExtenderService, form: PodForm | ClaimForm, name: str, namespace: str,
                priority: int, started: str | None = None) -> tuple[str, str]:
    """A pod of `form` running with `priority` (since `started`, when given); returns its UID and the UID its
    share is held under (the claim's for a claim pod)."""
    async with priority_class(svc, priority):
        pod = await running(svc, form, name, namespace)
    uid = pod["metadata"]["uid"]
    if started is not None:
        await svc.cluster.patch_pod_status(namespace, name, {"startTime": started})
        await eventually(lambda: (svc.pods.get(uid) or {}).get("status", {}).get("startTime") == started)
    return uid, await form.holder(svc, pod)


async def freed(svc: ExtenderService, pod_uid: str, holder: str) -> None:
    """Wait until the evicted pod is gone and, its claim collected, its share too."""
    await eventually(lambda: svc.pods.get(pod_uid) is None)
    await collect(svc.cluster)
    await eventually(lambda: holder not in svc.ledger.entries)


def evicted(svc: ExtenderService) -> list[list[str]]:
    """The pods each plan of gpupool's reclaim evicts (or evicted), one list per plan."""
    return [sorted(key for v in plan.victims for key, _ in v.pod.evicted) for plan in reclaim(svc).plans]


# --- priority preemption -----------------------------------------------------------------------------------

VICTIMS = [("pod", "pod"), ("claim", "claim"), ("pod", "claim")]


@pytest.mark.parametrize("preemptor", FORMS)
@pytest.mark.parametrize("victims", VICTIMS, ids="+".join)
async def test_a_higher_priority_pod_evicts_the_lowest_priority_share_in_either_form(
        victims: tuple[str, str], preemptor: str) -> None:
    """team-a (guarantee 2 GPUs) runs two whole GPUs: a1 (priority 2) and a2 (priority 1), each a pod or a
    claim pod. A pod of priority 10 asks a whole GPU in `preemptor`'s form: the node is full, so inside the
    queue the lowest priority goes, a2 (core's rule: lowest priority first), alone and once, with the reason
    recorded on both pods; then the preemptor gets a2's GPU. Before, a claim's share was never a victim: with
    claim victims nothing was evicted, or a1 (the only pod) instead of the cheaper a2."""
    svc = await service({"team-a": {"guaranteed": {"gpus": "2"}}})
    try:
        first, second = (FORMS[v] for v in victims)
        _, kept = await start(svc, first, "a1", "team-a", 2)
        a2, taken = await start(svc, second, "a2", "team-a", 1)
        f = FORMS[preemptor]
        async with priority_class(svc, 10):
            high = await f.create(svc, "high", "team-a")
        why = await f.schedule(svc, high)
        assert why is not None and "0 available" in why  # no GPU free, for now
        (plan,) = reclaim(svc).plans
        assert [(v.pod.uid, v.reason, v.pod.priority) for v in plan.victims] == [(taken, "priority", 1)]
        assert evicted(svc) == [["team-a/a2"]]
        await freed(svc, a2, taken)
        reason, message = events(svc, "team-a", "a2")[0]
        assert reason == "Preempted" and message.startswith("preempted in queue team-a by pod")
        assert "(10 > 1)" in message
        assert await f.schedule(svc, high) is None
        holder = await f.holder(svc, high)
        assert sorted(svc.ledger.entries) == sorted([kept, holder])
        assert len(reclaim(svc).plans) == 1 and not await gone(svc, "team-a", "a1")
    finally:
        await svc.stop()


# --- reclaim ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("owner", FORMS)
@pytest.mark.parametrize("borrower", FORMS)
async def test_a_queue_below_its_guarantee_reclaims_from_a_borrower_in_either_form(borrower: str, owner: str) -> None:
    """team-a (guarantee 1) runs both whole GPUs in `borrower`'s form: a1 started first, a2 later. team-b's owner
    asks one in `owner`'s form: the node is full, so team-a's borrowed GPU is reclaimed, the one that ran the
    least (a2: least run time lost), once; the owner then gets it and team-a keeps its guarantee. Before, a
    borrower's claim was never reclaimed and the owner waited for ever."""
    svc = await service({"team-a": {"guaranteed": {"gpus": "1"}}, "team-b": {"guaranteed": {"gpus": "1"}}})
    try:
        f = FORMS[borrower]
        _, kept = await start(svc, f, "a1", "team-a", 0)
        a2, taken = await start(svc, f, "a2", "team-a", 0, LATER)
        o = FORMS[owner]
        b1 = await o.create(svc, "b1", "team-b")
        why = await o.schedule(svc, b1)
        assert why is not None and "0 available" in why
        assert [(v.pod.uid, v.reason) for plan in reclaim(svc).plans for v in plan.victims] == [(taken, "reclaim")]
        assert evicted(svc) == [["team-a/a2"]]
        await freed(svc, a2, taken)
        reason, message = events(svc, "team-a", "a2")[0]
        assert reason == "Preempted" and message.startswith("reclaimed for queue team-b")
        assert await o.schedule(svc, b1) is None
        assert sorted(svc.ledger.entries) == sorted([kept, await o.holder(svc, b1)])
        assert svc.queues.usage()["team-a"].gpu_milli == 1000 and len(reclaim(svc).plans) == 1
    finally:
        await svc.stop()


# --- without team queues -------------------------------------------------------------------------------------------


async def without_queues() -> ExtenderService:
    """The same cluster with no GPUQueue (the one made is deleted): queues are off, though the namespaces still
    carry a queue label."""
    svc = await service({"team-a": {"guaranteed": {"gpus": "2"}}})
    await svc.cluster.delete_object(GPUQUEUES, "team-a")
    await eventually(lambda: not svc.queues.enabled)
    return svc


@pytest.mark.parametrize("victims", VICTIMS, ids="+".join)
async def test_without_queues_a_claim_pod_preempts_by_priority_alone(victims: tuple[str, str]) -> None:
    """No GPUQueue. a1 (priority 2) and a2 (priority 1) run both GPUs, each a pod or a claim pod. A claim pod of
    priority 10 asks one: kube-scheduler's preemption never sees it (it waits behind gpupool's scheduling
    gate), so gpupool preempts for it by priority alone: a2 goes, once, and the claim then gets its GPU. One
    of priority 1 would take nothing (equal to a2's). Before, a claim pod without queues waited for ever."""
    svc = await without_queues()
    try:
        first, second = (FORMS[v] for v in victims)
        _, kept = await start(svc, first, "a1", "team-a", 2)
        a2, taken = await start(svc, second, "a2", "team-a", 1)
        claim = ClaimForm()
        async with priority_class(svc, 1):
            equal = await claim.create(svc, "equal", "team-b")
        assert await claim.schedule(svc, equal) is not None and reclaim(svc).plans == []
        async with priority_class(svc, 10):
            high = await claim.create(svc, "high", "team-b")
        assert await claim.schedule(svc, high) is not None
        assert [[(v.pod.uid, v.reason) for v in plan.victims] for plan in reclaim(svc).plans] == [[(taken, "priority")]]
        await freed(svc, a2, taken)
        reason, message = events(svc, "team-a", "a2")[0]
        assert (reason, message.split(" by pod ")[0]) == ("Preempted", "preempted")
        claim_note = "; its claim team-a/a2-gpupool" if victims[1] == "claim" else ""
        assert message.endswith(f"of higher priority (10 > 1){claim_note}")
        assert await claim.schedule(svc, high) is None
        assert sorted(svc.ledger.entries) == sorted([kept, await claim.holder(svc, high)])
    finally:
        await svc.stop()


async def test_without_queues_a_pods_preemption_stays_kube_schedulers() -> None:
    """No GPUQueue, both GPUs held by claim pods of priority 1: a pod of priority 10 asking through
    `gpupool.io/*` limits gets no eviction from gpupool (kube-scheduler's preemption is the pod's, and the
    preempt verb judges its victims), as before queues existed."""
    svc = await without_queues()
    try:
        await start(svc, ClaimForm(), "a1", "team-a", 1)
        await start(svc, ClaimForm(), "a2", "team-a", 1)
        async with priority_class(svc, 10):
            high = await PodForm().create(svc, "high", "team-a")
        assert await PodForm().schedule(svc, high) is not None
        assert reclaim(svc).plans == [] and len(svc.ledger.entries) == 2
    finally:
        await svc.stop()


# --- the negative cases ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("preemptor", FORMS)
@pytest.mark.parametrize("victim", FORMS)
async def test_equal_priority_never_evicts_and_one_higher_does(victim: str, preemptor: str) -> None:
    """team-a runs both GPUs at priority 5 in `victim`'s form. A pod of priority 5 asks one: nothing is evicted
    and it waits. Another of priority 6 asks one: one of them (a2, the one that ran least) is evicted for it.
    Before, the second found no victim either when they were claims."""
    svc = await service({"team-a": {"guaranteed": {"gpus": "2"}}})
    try:
        f, p = FORMS[victim], FORMS[preemptor]
        await start(svc, f, "a1", "team-a", 5)
        _, taken = await start(svc, f, "a2", "team-a", 5, LATER)
        async with priority_class(svc, 5):
            equal = await p.create(svc, "equal", "team-a")
        assert await p.schedule(svc, equal) is not None
        assert reclaim(svc).plans == [] and len(svc.ledger.entries) == 2
        async with priority_class(svc, 6):
            higher = await p.create(svc, "higher", "team-a")
        assert await p.schedule(svc, higher) is not None
        assert [[(v.pod.uid, v.reason) for v in plan.victims] for plan in reclaim(svc).plans] == [[(taken, "priority")]]
    finally:
        await svc.stop()


@pytest.mark.parametrize("preemptor", FORMS)
@pytest.mark.parametrize("victim", FORMS)
async def test_a_pod_of_a_non_preempting_priority_class_takes_nothing(victim: str, preemptor: str) -> None:
    """team-a runs both GPUs at priority 1 in `victim`'s form; a pod of priority 10 whose class says
    `preemptionPolicy: Never` asks one: nothing is evicted, neither by priority nor (team-b, within its
    guarantee) by reclaim. The same ask with the default policy evicts one. Before, a pod's policy was
    ignored (its lower-priority pods were evicted), and claims were never victims."""
    svc = await service({"team-a": {"guaranteed": {"gpus": "1"}}, "team-b": {"guaranteed": {"gpus": "1"}}})
    try:
        f, p = FORMS[victim], FORMS[preemptor]
        await start(svc, f, "a1", "team-a", 1)
        _, taken = await start(svc, f, "a2", "team-a", 1, LATER)
        for namespace in ("team-a", "team-b"):
            async with priority_class(svc, 10, "Never"):
                polite = await p.create(svc, f"polite-{namespace}", namespace)
            assert await p.schedule(svc, polite) is not None
        assert reclaim(svc).plans == [] and len(svc.ledger.entries) == 2
        async with priority_class(svc, 10):
            pushy = await p.create(svc, "pushy", "team-b")
        assert await p.schedule(svc, pushy) is not None
        assert [[(v.pod.uid, v.reason) for v in plan.victims] for plan in reclaim(svc).plans] == [[(taken, "reclaim")]]
    finally:
        await svc.stop()


# --- a claim shared by several pods ------------------------------------------------------------------------------


async def shared_claim(svc: ExtenderService, name: str, users: dict[str, int], gpu: int = 0) -> tuple[str, list[str]]:
    """A claim of team-a allocated a whole GPU `gpu` of the node (no share asked: all of it) and reserved for
    running pods named by `users` (name -> priority), which name it in their spec as kube-scheduler had bound
    them; returns the claim's UID (its ledger entry) and the pods' UIDs."""
    uids = []
    for k, (user, priority) in enumerate(users.items()):
        async with priority_class(svc, priority):
            pod = await svc.cluster.create_pod({
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": user, "namespace": "team-a"},
                "spec": {"nodeName": NODE, "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                         "containers": [{"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}]},
                "status": {"phase": "Running", "startTime": f"2026-01-01T00:0{k}:00Z"}})
        uids.append(pod["metadata"]["uid"])
    claim = await svc.cluster.create_object(RESOURCE_CLAIMS, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": f"gpu-{gpu}"}]}},
            "reservedFor": [{"resource": "pods", "name": u, "uid": uid} for u, uid in zip(users, uids, strict=True)]}})
    uid = claim["metadata"]["uid"]
    await eventually(lambda: uid in svc.ledger.confirmed() and all(svc.pods.get(u) for u in uids))
    return uid, uids


@pytest.mark.parametrize("preemptor", FORMS)
@pytest.mark.parametrize("second", [2, 20])
async def test_a_shared_claim_is_a_victim_only_with_all_its_pods(second: int, preemptor: str) -> None:
    """GPU 0 is a claim shared by s1 (priority 1) and s2 (priority `second`), GPU 1 a claim pod a1 (priority 3),
    all of team-a. A pod of priority 10 asks one GPU. With s2 at 2 the shared claim is the lowest-priority share
    and goes with both its pods (two evictions, each recorded; once both are gone and the claim deallocated,
    the preemptor gets GPU 0). With s2 at 20 the shared claim may not be taken (evicting s1 alone frees
    nothing), so a1 goes. Before, neither claim was ever a victim."""
    svc = await service({"team-a": {"guaranteed": {"gpus": "2"}}})
    try:
        shared, (s1, s2) = await shared_claim(svc, "shared", {"s1": 1, "s2": second})
        a1, a1_claim = await start(svc, ClaimForm(), "a1", "team-a", 3)
        p = FORMS[preemptor]
        async with priority_class(svc, 10):
            high = await p.create(svc, "high", "team-a")
        assert await p.schedule(svc, high) is not None
        (plan,) = reclaim(svc).plans
        if second == 20:
            assert [v.pod.uid for v in plan.victims] == [a1_claim] and evicted(svc) == [["team-a/a1"]]
            await eventually(lambda: svc.pods.get(a1) is None)
            assert svc.pods.get(s1) is not None and svc.pods.get(s2) is not None
            return
        (victim,) = plan.victims
        assert (victim.pod.uid, victim.pod.priority, victim.reason) == (shared, 2, "priority")
        assert evicted(svc) == [["team-a/s1", "team-a/s2"]] and plan.cost(0.0)[0] == 2
        await eventually(lambda: svc.pods.get(s1) is None and svc.pods.get(s2) is None)
        for name in ("s1", "s2"):
            reason, message = events(svc, "team-a", name)[0]
            assert reason == "Preempted" and message.endswith("; its claim team-a/shared")
        assert svc.pods.get(a1) is not None
        await collect(svc.cluster)
        await eventually(lambda: shared not in svc.ledger.entries)
        assert await p.schedule(svc, high) is None
        holder = await p.holder(svc, high)
        assert svc.ledger.entries[holder].allocation.grants[0].index == 0
    finally:
        await svc.stop()


# --- the extender's preempt verb -----------------------------------------------------------------------------------


def proposed(*uids: str) -> MetaVictims:
    return MetaVictims(Pods=[MetaPod(UID=u) for u in uids], NumPDBViolations=0)


async def test_kube_schedulers_proposed_claim_pods_free_their_claims_shares() -> None:
    """GPU 0 is a claim shared by s1 and s2 (priorities 1 and 2), GPU 1 a claim pod a1 (priority 3); a pod
    without GPUs (web) runs beside them. kube-scheduler proposes victims for a whole-GPU pod of priority 10:
    - a1 and web: a1's claim frees GPU 1, web stays as proposed (kube-scheduler needed it for something else);
    - s1 and web: s1 alone frees nothing (s2 still uses the claim), so the node is dropped;
    - s1, s2 and a1: either claim frees a GPU; the most costly to evict (a1, priority 3) is given back.
    Before, a claim pod counted as holding no GPU: kept whatever it freed, and the node dropped each time."""
    svc = await service({"team-a": {"guaranteed": {"gpus": "2"}}})
    try:
        _, (s1, s2) = await shared_claim(svc, "shared", {"s1": 1, "s2": 2})
        a1, _ = await start(svc, ClaimForm(), "a1", "team-a", 3)
        web = await svc.cluster.create_pod({"apiVersion": "v1", "kind": "Pod",
                                            "metadata": {"name": "web", "namespace": "team-a"},
                                            "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "x"}]}})
        async with priority_class(svc, 10):
            high = await PodForm().create(svc, "high", "team-a")

        async def answer(*uids: str) -> dict[str, MetaVictims]:
            args = ExtenderPreemptionArgs(Pod=high, NodeNameToMetaVictims={NODE: proposed(*uids)})
            return (await svc.preempt(args)).NodeNameToMetaVictims

        web_uid = web["metadata"]["uid"]
        assert await answer(a1, web_uid) == {NODE: proposed(a1, web_uid)}
        assert await answer(s1, web_uid) == {}
        assert await answer(s1, s2, a1) == {NODE: proposed(s1, s2)}
    finally:
        await svc.stop()


# --- the property: a claim's share is chosen as the equivalent pod's ------------------------------------------------

NOW = 1_767_312_000.0  # 2026-01-02T00:00:00Z: the scheduler's clock in the property (no wall clock)
GPU_MIB = 16384  # small_scenario's cards


@dataclass(frozen=True)
class Held:
    """One running share of the property's state: where, how much, whose, and in which form."""

    gpu: int
    cores: int
    memory_mib: int
    priority: int
    team: str
    claim: bool


# Shares large enough, and asks too, that most states leave the ask no room without a victim.
HELD = st.lists(st.builds(Held, gpu=st.integers(0, 1), cores=st.integers(40, 100),
                          memory_mib=st.integers(2, 16).map(lambda g: g * 1024), priority=st.integers(0, 3),
                          team=st.sampled_from(["team-a", "team-b"]), claim=st.booleans()),
                min_size=3, max_size=6)
ASK = st.tuples(st.integers(50, 100), st.integers(6, 16), st.integers(1, 4), st.sampled_from(["team-a", "team-b"]))


async def _state(held: list[Held]) -> ExtenderService:
    """One node with two GPUs of 16 GiB, team-a and team-b each guaranteed one, and `held` running in order
    (a share that does not fit where it asks is left out), the k-th started k minutes after midnight."""
    cluster = MemoryCluster()
    for obj in node_objects(small_scenario(nodes=1, gpus=2, memory_mib=GPU_MIB)):
        await cluster.create_node(obj)
    await cluster.create_object(CRDS, yaml.safe_load(QUEUE_CRD.read_text()))
    for team in ("team-a", "team-b"):
        await cluster.create_object(NAMESPACES, {"metadata": {"name": team, "labels": {LABEL_QUEUE: team}}})
        await cluster.create_object(GPUQUEUES, {"metadata": {"name": team}, "spec": {"guaranteed": {"gpus": "1"}}})
    svc = ExtenderService(cluster, SchedulerConfig(leader_elect=False), clock=lambda: NOW)
    await svc.start()
    await eventually(lambda: svc.queues.enabled and svc.queues.queue_of("team-b") == "team-b")
    free = {0: [1000, GPU_MIB, 3], 1: [1000, GPU_MIB, 3]}  # milli, MiB, shares left (under the node's limit)
    holders = []
    for k, h in enumerate(held):
        room = free[h.gpu]
        if h.cores * 10 > room[0] or h.memory_mib > room[1] or room[2] == 0:
            continue
        room[0], room[1], room[2] = room[0] - h.cores * 10, room[1] - h.memory_mib, room[2] - 1
        name, started = f"held-{k}", f"2026-01-01T00:{k:02d}:00Z"
        pod: dict[str, Any]
        if h.claim:
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": h.team},
                   "spec": {"nodeName": NODE, "priority": h.priority,
                            "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}],
                            "containers": [{"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}]},
                   "status": {"phase": "Running", "startTime": started}}
        else:
            pod = gpu_pod(name, cores=h.cores, memory=h.memory_mib, namespace=h.team)
            pod["spec"]["nodeName"], pod["spec"]["priority"] = NODE, h.priority
            pod["status"] = {"phase": "Running", "startTime": started}
        uid = (await cluster.create_pod(pod))["metadata"]["uid"]
        if h.claim:
            claim = await cluster.create_object(RESOURCE_CLAIMS, {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": f"{name}-gpu", "namespace": h.team,
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}]},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": f"gpu-{h.gpu}",
                     "consumedCapacity": {"memory": f"{h.memory_mib}Mi", "cores": str(h.cores)}}]}},
                    "reservedFor": [{"resource": "pods", "name": name, "uid": uid}]}})
            holders.append(claim["metadata"]["uid"])
        else:
            gpu = svc.ledger.state.gpu_at(NODE, h.gpu)
            assert gpu is not None
            grant = GPUGrant(gpu.uuid, h.gpu, h.cores * 10, h.memory_mib)
            text = encode_allocation(Allocation(uid, NODE, (grant,)), uid, "hook", started)
            await cluster.patch_pod_annotations(h.team, name, {ANN_ALLOCATION: text})
            holders.append(uid)
    await eventually(lambda: set(holders) <= set(svc.ledger.confirmed()))
    return svc


async def _victims(held: list[Held], ask: tuple[int, int, int, str]) -> list[tuple[str, str]] | None:
    """The pods (namespace/name) core's plan evicts for a pending pod asking `ask` (cores, GiB, priority,
    team) on the state `held`, with each one's reason; None when no plan exists."""
    cores, gib, priority, team = ask
    svc = await _state(held)
    try:
        pod = gpu_pod("asks", cores=cores, memory=gib * 1024, namespace=team)
        pod["spec"]["priority"] = priority
        uid = (await svc.cluster.create_pod(pod))["metadata"]["uid"]
        await eventually(lambda: svc.pods.get(uid) is not None)
        cached = svc.pods.get(uid)
        assert cached is not None
        cycle = svc.framework.cycle(cached, Phase.FILTER)
        assert svc.framework.pre_filter(cycle).ok
        chosen = svc.handle.preemption.choose(cycle, frozenset({NODE}), NOW)
        if chosen is None:
            return None
        return sorted((key, v.reason) for v in chosen[1].victims for key, _ in v.pod.evicted)
    finally:
        await svc.stop()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(HELD, ASK)
def test_the_victims_chosen_on_a_state_with_claims_are_those_chosen_when_all_are_pods(
        held: list[Held], ask: tuple[int, int, int, str]) -> None:
    """Any shares on one node's two GPUs (each a share of compute and memory, of team-a or team-b, priority 0-3,
    a pod's own or a claim's), any pending pod asking one GPU: the pods evicted for it, and why, are the same
    when each share is in the form drawn as when every share is a pod's. Before, a claim's share was never a
    victim, so a state with claims chose others, or none."""
    as_pods = [replace(h, claim=False) for h in held]
    assert asyncio.run(_victims(held, ask)) == asyncio.run(_victims(as_pods, ask))
