"""gpupool as the allocator of its own DRA claims: pods whose claims ask for gpupool's DeviceClasses get
their node and GPUs from gpupool's placement policy, the same decision (and the same ledger) as a pod
asking through the device plugin, instead of kube-scheduler's first-fit allocator.

How it meets kube-scheduler (docs/claims.md, Placement): the webhook puts the scheduling gate
`gpu.gpupool.io/allocate` on such pods, so kube-scheduler leaves them alone. Here, once the pod's claims
exist (the resourceclaim controller makes them from their templates), the policy picks a node and GPUs
among the nodes that publish gpupool's ResourceSlice and that the pod may run on (its nodeSelector, the
nodes' NoSchedule/NoExecute taints, untainted devices), the ledger assumes the share, the claim's
`status.allocation` is written (results with consumedCapacity and a share ID, the class's config, the
node as nodeSelector), and the gate is removed. kube-scheduler then sees an allocated claim: it can only
place the pod on that node, reserves the claim for the pod and binds it, running its own filters (CPU,
affinity) as for any pod. A burst packs as the policy says, because every decision is taken here, one at a
time, against the ledger that already holds the previous ones.

A claim of the MIG class that names its profile with the selector
`device.attributes["gpu.gpupool.io"].profile == "<profile>"` gets the partition gpupool's MIG planning
chooses (core.mig_placement: the GPU and start slot that leave the least fragmentation for the profiles in
use), where kube-scheduler's allocator would take the first partition that fits.

What gpupool does not decide is left to kube-scheduler's allocator, and the gate removed at once: claims of
other classes, claims with other CEL selectors (only kube-scheduler evaluates CEL), constraints, prioritized
lists or admin access, pods with several unallocated claims or requests. Claims already allocated (a
shared claim) need nothing. The ledger counts every claim on gpupool's devices however it was allocated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gpupool.api.dra import (
    DELETE_PROTECTION,
    DRIVER,
    SCHEDULING_GATE,
    ClaimAsk,
    ClaimError,
    NotOurs,
    Placed,
    allocation_status,
    claim_asks,
    class_isolation,
    class_oversubscription,
    device_index,
    device_name,
    mig_device,
    mig_device_name,
    oversub_mib,
    template_for,
)
from gpupool.api.logsafe import shown
from gpupool.api.pod import parse_pod, pod_key
from gpupool.api.preferences import untolerated
from gpupool.api.times import format_time
from gpupool.cluster.port import (
    DEVICE_CLASSES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    AlreadyExists,
    ApiError,
    Obj,
    WatchEvent,
)
from gpupool.cluster.reflector import Reflector
from gpupool.core.mig import mig_model
from gpupool.core.mig_placement import MigGPU, MigInstance, MigRefusal, choose, observed_demand
from gpupool.core.mig_request import grant_share
from gpupool.core.model import MILLI_PER_GPU, Allocation, GPUGrant, GPURequest, MigSlot, PodRequest
from gpupool.core.placement import Unschedulable, place
from gpupool.scheduler.framework.interface import Handle

log = logging.getLogger(__name__)

@dataclass
class Usable:
    """gpupool's devices the allocator may hand out, by node: shared GPUs and GPUs in MIG mode (indices)."""

    shared: dict[str, set[int]] = field(default_factory=dict)
    mig: dict[str, set[int]] = field(default_factory=dict)


RETRY_S = 5.0  # a pod that fits nowhere is tried again this often (and at once on any claim or pod change)
HARD_EFFECTS = ("NoSchedule", "NoExecute")  # taints that keep new pods (and claims) away; PreferNoSchedule does not
MAX_TEMPLATES_KNOWN = 10_000  # tenants name templates: what is remembered of them stays bounded


def gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == SCHEDULING_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


class ClaimAllocator:
    """Places the claims of gated pods (fed by gpupool.scheduler.watch: pods and claims)."""

    def __init__(self, handle: Handle, ready: Callable[[], bool], retry_s: float = RETRY_S) -> None:
        self.h = handle
        self.ready = ready
        self.retry_s = retry_s
        self.claims: dict[str, Obj] = {}  # namespace/name -> claim, every claim the watch shows
        self.gated: dict[str, Obj] = {}  # pod UID -> pod, the pods carrying our gate
        self.told: dict[str, str] = {}  # pod UID -> the last reason recorded on it (one Event per change)
        self.templates: set[tuple[str, str]] = set()  # gpupool's templates known to exist (namespace, name)
        self.allocated = 0  # claims gpupool allocated (metrics, tests)
        self.left = 0  # pods whose claims were left to kube-scheduler
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # The classes and the devices from watch caches: a pass reads no list from the API server, and a
        # device that changes (a taint goes, a GPU appears) wakes the pods that wait for one.
        self._class_ref = Reflector(handle.cluster, DEVICE_CLASSES, on_event=self._wake)
        self._slice_ref = Reflector(handle.cluster, RESOURCE_SLICES, on_event=self._wake)

    def _wake(self, type_: str, obj: Obj, old: Obj | None) -> None:
        self._changed.set()

    # --- fed by the watch ------------------------------------------------------------------------------
    def claim_event(self, event: WatchEvent) -> None:
        meta = event.object.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if event.type == "DELETED":
            self.claims.pop(key, None)
        else:
            self.claims[key] = event.object
        self._changed.set()

    def replace_claims(self, claims: list[Obj]) -> None:
        self.claims = {}
        for c in claims:
            self.claim_event(WatchEvent("ADDED", c))

    def pod_event(self, event_type: str, pod: Mapping[str, Any]) -> None:
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        if event_type != "DELETED" and gated(pod):
            self.gated[uid] = dict(pod)
            self._changed.set()
        else:
            self.gated.pop(uid, None)
            self.told.pop(uid, None)

    # --- the loop -------------------------------------------------------------------------------------
    def start(self) -> None:
        self._class_ref.start()
        self._slice_ref.start()
        self._task = asyncio.create_task(self._run(), name="claim-allocator")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._class_ref.stop()
        await self._slice_ref.stop()

    async def _run(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow the cancellation that stops
            # this task when the event is set at the same moment, and the service's stop then waits forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.retry_s):
                    await self._changed.wait()
            self._changed.clear()
            if not self.ready() or not self.gated or not (self._class_ref.synced.is_set()
                                                          and self._slice_ref.synced.is_set()):
                continue
            try:
                await self.pass_once()
            except Exception as e:  # one bad pass must not stop allocation for good
                log.warning("claim allocation pass failed: %s", e)

    async def pass_once(self) -> None:
        """Try every gated pod once, oldest first."""
        classes = self._classes()
        slices = self._slices()
        pods = sorted(self.gated.values(), key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp", "")))
        for pod in pods:
            uid = str(pod["metadata"].get("uid", ""))
            if uid not in self.gated:
                continue
            waiting = await self._place(pod, classes, slices)
            if waiting and self.told.get(uid) != waiting:
                self.told[uid] = waiting
                m = pod["metadata"]
                await self.h.record_event(m.get("namespace", ""), m.get("name", ""), uid, "FailedScheduling",
                                          f"gpupool: {waiting}"[:1024], "Warning")

    def _classes(self) -> dict[str, tuple[str, list[Obj]]]:
        """gpupool's DeviceClasses: name -> (isolation, config)."""
        out = {}
        for c in self._class_ref.items():
            iso = class_isolation(c)
            if iso is not None:
                out[str(c["metadata"]["name"])] = (iso, list((c.get("spec") or {}).get("config") or []))
        return out

    def _slices(self) -> Usable:
        """gpupool's devices without a NoSchedule/NoExecute taint, by node: shared GPUs and MIG GPUs. Only
        the slices of a pool's newest generation count, as for kube-scheduler: an older one still listed
        (the agent is replacing the pool, a GPU just left MIG mode) shows devices that are gone."""
        out = Usable()
        ours = [s for s in self._slice_ref.items() if (s.get("spec") or {}).get("driver") == DRIVER]
        newest: dict[str, int] = {}
        for s in ours:
            pool = (s.get("spec") or {}).get("pool") or {}
            name = str(pool.get("name", ""))
            newest[name] = max(newest.get(name, 0), int(pool.get("generation", 0) or 0))
        for s in ours:
            spec = s.get("spec") or {}
            pool = spec.get("pool") or {}
            if int(pool.get("generation", 0) or 0) < newest[str(pool.get("name", ""))]:
                continue
            node = str(spec.get("nodeName", ""))
            shared, mig = out.shared.setdefault(node, set()), out.mig.setdefault(node, set())
            for d in spec.get("devices") or []:
                if any(t.get("effect") in HARD_EFFECTS for t in d.get("taints") or []):
                    continue
                name = str(d.get("name", ""))
                index, partition = device_index(name), mig_device(name)
                if index is not None:
                    shared.add(index)
                elif partition is not None:
                    mig.add(partition[0])
        return out

    # --- one pod --------------------------------------------------------------------------------------
    async def _place(self, pod: Obj, classes: Mapping[str, tuple[str, list[Obj]]], slices: Usable) -> str | None:
        """Allocate the pod's claim and ungate it. Returns None when the pod is done (ungated), else why it
        waits ("" when there is nothing to tell: its claims are not made yet)."""
        ns = str(pod["metadata"].get("namespace", ""))
        generated = {s.get("name"): s.get("resourceClaimName")
                     for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        claims = []
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            name = ref.get("resourceClaimName")
            if not name:  # from a template: the resourceclaim controller records the claim it made
                if ref.get("name") not in generated:
                    await self._ensure_template(ns, str(ref.get("resourceClaimTemplateName", "")))
                    return ""  # not made yet: the pod watch brings the name
                name = generated[ref.get("name")]
                if name is None:
                    continue  # the template asks for nothing on this pod
            claim = self.claims.get(f"{ns}/{name}")
            if claim is None:
                return ""  # not seen yet: the claim watch brings it
            claims.append(claim)
        todo: list[tuple[Obj, list[ClaimAsk]]] = []
        for c in claims:
            if (c.get("status") or {}).get("allocation"):
                continue
            try:
                todo.append((c, claim_asks(c, {n: iso for n, (iso, _) in classes.items()})))
            except NotOurs as e:
                return await self._leave(pod, str(e))
        if not todo:
            return await self._ungate(pod)
        if len(todo) != 1 or len(todo[0][1]) != 1:
            return await self._leave(pod, "several unallocated gpupool claims or requests")
        claim, (ask,) = todo[0]
        if ask.mig_profile is not None:
            return await self._allocate_mig(pod, claim, ask, classes[ask.device_class][1], slices)
        return await self._allocate(pod, claim, ask, classes[ask.device_class], slices)

    async def _ensure_template(self, namespace: str, name: str) -> None:
        """Make the ResourceClaimTemplate a translated device-plugin pod points at (its name says its share:
        gpupool.api.dra.template_for), once per namespace and name; any other template is the user's."""
        if (namespace, name) in self.templates:
            return
        template = template_for(name, namespace)
        if template is None:
            return
        try:
            await self.h.cluster.create_object(RESOURCE_CLAIM_TEMPLATES, template)
            log.info("made ResourceClaimTemplate %s/%s", namespace, shown(name))
        except AlreadyExists:
            pass
        except ApiError as e:
            log.warning("cannot make ResourceClaimTemplate %s/%s: %s", namespace, shown(name), e)
            return
        if len(self.templates) >= MAX_TEMPLATES_KNOWN:  # bounded: forgetting costs one AlreadyExists each
            self.templates.clear()
        self.templates.add((namespace, name))

    def _allowed(self, pod: Obj, names: Iterable[str]) -> list[str]:
        """The nodes among `names` that the ledger knows and the pod may go to (its nodeSelector, the nodes'
        NoSchedule/NoExecute taints)."""
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        out = []
        for name in names:
            obj = self.h.ledger.node_objs.get(name)
            if name not in self.h.ledger.state.index or obj is None:
                continue
            labels = (obj.get("metadata") or {}).get("labels") or {}
            hard = [t for t in (obj.get("spec") or {}).get("taints") or [] if t.get("effect") in HARD_EFFECTS]
            if all(labels.get(k) == v for k, v in selector.items()) and not untolerated(pod, hard):
                out.append(name)
        return out

    def _nodes(self, pod: Obj, slices: Mapping[str, set[int]], mps: bool) -> tuple[list[int], frozenset[str]]:
        """The ledger's node indices the pod may go to, and the GPUs it must not get: tainted devices, and
        GPUs already shared by as many pods and claims as their node allows (the ledger would refuse the
        share there, while another GPU may be free)."""
        state = self.h.ledger.state
        nodes, excluded = [], set()
        for name in self._allowed(pod, slices):
            i = state.index[name]
            nodes.append(i)
            full = self.h.ledger.full(np.array([i], dtype=np.int64), mps)[0]
            excluded |= {g.uuid for g in state.nodes[i].gpus if g.index not in slices[name] or full[g.index]}
        return sorted(nodes), frozenset(excluded)

    async def _allocate(self, pod: Obj, claim: Obj, ask: ClaimAsk, cls: tuple[str, list[Obj]],
                        slices: Usable) -> str | None:
        isolation, config = cls
        label = self._label(claim)
        try:
            factor = class_oversubscription(config, label)
        except ClaimError as e:
            return str(e)
        parsed = parse_pod(pod).request or PodRequest(key=pod_key(pod))
        whole = ask.memory_mib is None  # no memory asked: the request policy's default, the whole GPU
        gpu = GPURequest(count=ask.count, milli=MILLI_PER_GPU if whole else max(1, ask.cores * 10),
                         memory_mib=None if whole else ask.memory_mib)
        nodes, excluded = self._nodes(pod, slices.shared, isolation == "mps")
        # memory oversubscription is served from the node's memory: the node must have it beside the pod's
        spill = 0 if ask.memory_mib is None else ask.count * oversub_mib(ask.memory_mib, factor)
        request = replace(parsed, memory_mib=parsed.memory_mib + spill, gpu=replace(gpu, exclude_uuids=excluded))
        if not nodes:
            return "no node that runs gpupool's DRA driver can take this pod (its nodeSelector, the nodes' taints)"
        state = self.h.ledger.state
        decided = place(state, request, self.h.policy(request), self.h.context(), np.array(nodes, dtype=np.int64))
        if isinstance(decided, Unschedulable):
            return f"claim {shown(self._label(claim))} fits on no GPU: {decided.summary()}"
        uid = str(claim["metadata"]["uid"])
        allocation = replace(decided.allocation, pod=uid)
        # The claim holds the GPU share and what oversubscription may take of the node's memory (as
        # api.dra.counted_claim counts it); the pod's own CPU and memory are kube-scheduler's to count.
        held = replace(request, key=uid, cpu_milli=0,
                       memory_mib=sum(oversub_mib(g.memory_mib, factor) for g in allocation.grants))
        refused = self.h.ledger.assume(uid, label, held, allocation, self.h.clock() + self.h.config.assume_timeout_s,
                                       mps=isolation == "mps", claim=True)
        if refused is not None:
            return f"claim {shown(label)}: {refused}"
        devices = [Placed(ask, device_name(g.index), g.memory_mib, 0 if g.milli < 10 else g.milli // 10,
                          str(uuid.uuid4())) for g in allocation.grants]
        return await self._write(pod, claim, allocation, allocation_status(allocation.node, devices,
                                                                          {ask.device_class: config}))

    async def _allocate_mig(self, pod: Obj, claim: Obj, ask: ClaimAsk, config: list[Obj],
                            slices: Usable) -> str | None:
        """A MIG partition of the profile asked, where gpupool's MIG planning (core.mig_placement.choose)
        leaves the GPUs least fragmented for the profiles in use, against the ledger's instances (pods' and
        claims', however allocated)."""
        assert ask.mig_profile is not None
        state, label, uid = self.h.ledger.state, self._label(claim), str(claim["metadata"]["uid"])
        held: dict[tuple[str, int], list[MigInstance]] = {}
        for entry in self.h.ledger.entries.values():
            for g in entry.allocation.grants:
                if g.mig is not None:
                    held.setdefault((entry.allocation.node, g.index), []).append(
                        MigInstance(g.mig.profile, g.mig.start, used=True))
        candidates = [(node, gpu) for node in self._allowed(pod, slices.mig) for index in sorted(slices.mig[node])
                      if (gpu := state.gpu_at(node, index)) is not None and mig_model(gpu.model) is not None]
        if not candidates:
            return "no GPU in MIG mode that this pod may use (its nodeSelector, the nodes' taints)"
        demand = observed_demand([ask.mig_profile, *(i.profile for group in held.values() for i in group)])
        gpus = [MigGPU(gpu.model, tuple(sorted(held.get((node, gpu.index), [])))) for node, gpu in candidates]
        choice = choose(gpus, ask.mig_profile, demand)
        if isinstance(choice, MigRefusal):
            return f"claim {shown(label)}: {choice.reason}"
        node, gpu = candidates[choice.gpu]
        model = mig_model(gpu.model)
        profile = model.profile(ask.mig_profile) if model is not None else None
        assert model is not None and profile is not None  # choose found an option of this profile there
        milli, memory = grant_share(model, profile)
        start = choice.option.start
        allocation = Allocation(uid, node, (GPUGrant(gpu.uuid, gpu.index, milli, memory,
                                                     MigSlot(profile.name, start)),), policy="dra")
        request = PodRequest(key=uid, gpu=GPURequest(count=1, milli=milli, memory_mib=memory))
        refused = self.h.ledger.assume(uid, label, request, allocation, self.h.clock() + self.h.config.assume_timeout_s,
                                       claim=True)
        if refused is not None:
            return f"claim {shown(label)}: {refused}"
        placed = [Placed(ask, mig_device_name(gpu.index, profile.name, start))]
        return await self._write(pod, claim, allocation, allocation_status(node, placed, {ask.device_class: config}))

    async def _write(self, pod: Obj, claim: Obj, allocation: Allocation, status: Obj) -> str | None:
        """Write the claim's allocation (the ledger already holds it; forgotten if the write fails), then
        ungate the pod."""
        uid, label = str(claim["metadata"]["uid"]), self._label(claim)
        # Stamped as kube-scheduler's own allocator stamps it. When kube-scheduler 1.37 reserves a claim whose
        # allocation has no timestamp, it adds one (DRADeviceBindingConditions and DRAResourceClaimDeviceStatus,
        # on by default) in the same status update, and the API server refuses that update, as any change of
        # an allocation once set: without the stamp, the pod would never be bound.
        status["allocationTimestamp"] = format_time(self.h.clock())
        ns, name = str(claim["metadata"]["namespace"]), str(claim["metadata"]["name"])
        try:
            finalizers = list(claim["metadata"].get("finalizers") or [])
            if DELETE_PROTECTION not in finalizers:
                await self.h.cluster.patch_object(RESOURCE_CLAIMS, name, {"metadata": {
                    "finalizers": [*finalizers, DELETE_PROTECTION]}}, namespace=ns,
                    resource_version=str(claim["metadata"].get("resourceVersion", "")) or None)
            await self.h.cluster.patch_object(RESOURCE_CLAIMS, name, {"status": {"allocation": status}},
                                              namespace=ns, subresource="status")
        except ApiError as e:
            self.h.ledger.forget(uid)
            return f"claim {shown(label)} could not be allocated: {e}"
        self.allocated += 1
        log.info("allocated claim %s of pod %s: %s %s", label, pod_key(pod), allocation.node,
                 ", ".join(r["device"] for r in status["devices"]["results"]))
        return await self._ungate(pod)

    async def _leave(self, pod: Obj, why: str) -> str | None:
        log.info("pod %s: left to kube-scheduler's allocator (%s)", pod_key(pod), why)
        self.left += 1
        return await self._ungate(pod)

    async def _ungate(self, pod: Obj) -> str | None:
        m = pod["metadata"]
        gates = [g for g in (pod.get("spec") or {}).get("schedulingGates") or [] if g.get("name") != SCHEDULING_GATE]
        try:
            await self.h.cluster.patch_object(PODS, str(m["name"]), {"spec": {"schedulingGates": gates or None}},
                                              namespace=str(m["namespace"]))
        except ApiError as e:
            return f"its scheduling gate could not be removed: {e}"
        self.gated.pop(str(m.get("uid", "")), None)
        return None

    @staticmethod
    def _label(claim: Mapping[str, Any]) -> str:
        m = claim.get("metadata") or {}
        return f"{m.get('namespace', '')}/{m.get('name', '')}"
