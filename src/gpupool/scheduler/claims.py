"""gpupool as the allocator of its own DRA claims: pods whose claims ask for gpupool's DeviceClasses get
their node and GPUs from the scheduler framework (gpupool.scheduler.framework), the very plugins and ledger
that place a pod asking through the device plugin, instead of kube-scheduler's first-fit allocator.

How it meets kube-scheduler (docs/claims.md, Placement): the webhook puts the scheduling gate
`gpu.gpupool.io/allocate` on such pods, so kube-scheduler leaves them alone. Here, once the pod's claims
exist (the resourceclaim controller makes them from their templates), the pod's claim is one framework cycle
under the claim profile (gpupool.scheduler.framework.registry.CLAIM_PROFILE): the team queues (admission,
maximum, reclaim, priority preemption), fit, shares per GPU, MPS daemons, MIG planning, the policy's score,
busy nodes and PreferNoSchedule taints, as for a pod; and the claim's own rules as plugins: its request
(claim_request), gpupool's untainted devices on nodes the pod may run on (claim_nodes, claim_devices), the
tiers of a remote share (remote_tiers), its reservation in the ledger under the claim's UID (claim_reserve). This module
keeps only what is not a placement rule: it watches pods, claims, DeviceClasses and ResourceSlices, decides
which gated pods are gpupool's to place (below), writes the claim's `status.allocation` (results with
consumedCapacity and a share ID, the class's config, the node as nodeSelector) and removes the gate.
kube-scheduler then sees an allocated claim: it can only place the pod on that node, reserves the claim for
the pod and binds it, running its own filters (CPU, affinity) as for any pod. A burst packs as the policy
says, because every decision is taken here, one at a time, against the ledger that already holds the
previous ones.

What gpupool does not decide is left to kube-scheduler's allocator, and the gate removed at once: claims of
other classes, claims with other CEL selectors (only kube-scheduler evaluates CEL), constraints, prioritized
lists or admin access, pods with several unallocated claims or requests, pods with required pod
(anti-)affinity or topology spread that may not be broken (they depend on every pod, which only
kube-scheduler weighs). Claims already allocated (a shared claim) need nothing. The ledger counts every
claim on gpupool's devices however it was allocated."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupool.api.dra import (
    ATTR_REMOTE_SERVER,
    DELETE_PROTECTION,
    DRIVER,
    REMOTE_ISOLATION,
    SCHEDULING_GATE,
    ClaimAsk,
    NotOurs,
    Placed,
    allocation_status,
    claim_asks,
    class_isolation,
    device_index,
    device_name,
    mig_device,
    mig_device_name,
    template_for,
)
from gpupool.api.logsafe import shown
from gpupool.api.pod import pod_key
from gpupool.api.preferences import pod_rules
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
from gpupool.scheduler.framework.cycle import ClaimInCycle, CycleState, Phase
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.preemption import priority_of
from gpupool.scheduler.framework.registry import CLAIM_PROFILE, build_plugins
from gpupool.scheduler.framework.runtime import Framework
from gpupool.scheduler.framework.status import Code
from gpupool.scheduler.moves import MakeRoom
from gpupool.scheduler.node_rules import HARD_EFFECTS

log = logging.getLogger(__name__)


@dataclass
class Usable:
    """gpupool's devices the allocator may hand out, by node: shared GPUs and GPUs in MIG mode (indices),
    the shared GPUs among them that a GPU server serves remote shares of, and every node that publishes a
    pool (GPU-less nodes too: a remote share's pod may run on any node whose agent runs)."""

    shared: dict[str, set[int]] = field(default_factory=dict)
    mig: dict[str, set[int]] = field(default_factory=dict)
    remote: dict[str, set[int]] = field(default_factory=dict)
    drivers: set[str] = field(default_factory=set)
    _frozen: dict[str, tuple[dict[str, frozenset[int]], list[str]]] = field(
        default_factory=dict, repr=False, compare=False)
    _agents: frozenset[str] | None = field(default=None, repr=False, compare=False)

    def frozen(self, kind: str) -> tuple[Mapping[str, frozenset[int]], list[str]]:
        """The nodes with devices of `kind` ("shared", "mig" or "remote") and their GPUs, frozen, and those
        nodes sorted: made once per Usable (one pass), not once per claim (8 ms a claim on 5,000 nodes)."""
        if kind not in self._frozen:
            devices: dict[str, set[int]] = getattr(self, kind)
            gpus = {node: frozenset(indices) for node, indices in devices.items() if indices}
            self._frozen[kind] = (gpus, sorted(gpus))
        return self._frozen[kind]

    def agents(self) -> frozenset[str]:
        """`drivers`, frozen once per Usable (thousands of names: 1-2 ms a claim when made per claim)."""
        if self._agents is None:
            self._agents = frozenset(self.drivers)
        return self._agents


RETRY_S = 5.0  # a pod that fits nowhere is tried again this often (and at once on any claim or pod change)
# Claims whose allocation (and pod's gate) are being written at once. Decisions stay one at a time against
# the ledger, which holds each from its Reserve on; only the API round trips overlap (three a claim, which
# one after the other made a burst wait on the API server's latency: docs/claims.md, "Claims at scale").
MAX_WRITES = 16
MAX_TEMPLATES_KNOWN = 10_000  # tenants name templates: what is remembered of them stays bounded


def gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == SCHEDULING_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def usable_devices(slices: Iterable[Mapping[str, Any]]) -> Usable:
    """gpupool's devices without a NoSchedule/NoExecute taint, by node: shared GPUs and MIG GPUs. Only
    the slices of a pool's newest generation count, as for kube-scheduler: an older one still listed
    (the agent is replacing the pool, a GPU just left MIG mode) shows devices that are gone. (`gpupool migrate`
    and `drain` choose a remote share's new GPU among the same.)"""
    out = Usable()
    ours = [s for s in slices if (s.get("spec") or {}).get("driver") == DRIVER]
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
        out.drivers.add(node)
        shared, mig = out.shared.setdefault(node, set()), out.mig.setdefault(node, set())
        remote = out.remote.setdefault(node, set())
        for d in spec.get("devices") or []:
            if any(t.get("effect") in HARD_EFFECTS for t in d.get("taints") or []):
                continue
            name = str(d.get("name", ""))
            index, partition = device_index(name), mig_device(name)
            if index is not None:
                shared.add(index)
                if ((d.get("attributes") or {}).get(ATTR_REMOTE_SERVER) or {}).get("string"):
                    remote.add(index)
            elif partition is not None:
                mig.add(partition[0])
    return out




class ClaimAllocator:
    """Places the claims of gated pods (fed by gpupool.scheduler.watch: pods and claims)."""

    def __init__(self, handle: Handle, ready: Callable[[], bool], retry_s: float = RETRY_S,
                 framework: Framework | None = None, room: MakeRoom | None = None) -> None:
        self.h = handle
        self.room = room  # moves remote shares for a remote claim that fits nowhere (None: never)
        self.ready = ready
        self.retry_s = retry_s
        # The framework under the claim profile; the service gives the one whose plugins are the pod
        # profile's own instances (gpupool.scheduler.framework.registry.build_profiles).
        self._fw = framework
        self.claims: dict[str, Obj] = {}  # namespace/name -> claim, every claim the watch shows
        self.gated: dict[str, Obj] = {}  # pod UID -> pod, the pods carrying our gate
        self.told: dict[str, str] = {}  # pod UID -> the last reason recorded on it (one Event per change)
        self.templates: set[tuple[str, str]] = set()  # gpupool's templates known to exist (namespace, name)
        self.allocated = 0  # claims gpupool allocated (metrics, tests)
        self.left = 0  # pods whose claims were left to kube-scheduler
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._writes: set[asyncio.Task[None]] = set()  # allocations being written (a pass waits for them all)
        # The classes and the devices from watch caches: a pass reads no list from the API server, and a
        # device that changes (a taint goes, a GPU appears) wakes the pods that wait for one.
        self._class_ref = Reflector(handle.cluster, DEVICE_CLASSES, on_event=self._wake)
        self._slice_ref = Reflector(handle.cluster, RESOURCE_SLICES, on_event=self._slice_changed)
        # The devices as read from the slices, until a slice changes: reading 5,000 nodes' slices took 80 ms,
        # once per pass, and a burst's pods arrive over many passes.
        self._usable: Usable | None = None

    @property
    def fw(self) -> Framework:
        if self._fw is None:
            self._fw = Framework(self.h, build_plugins(self.h, CLAIM_PROFILE))
        return self._fw

    def _wake(self, type_: str, obj: Obj, old: Obj | None) -> None:
        self._changed.set()

    def _slice_changed(self, type_: str, obj: Obj, old: Obj | None) -> None:
        self._usable = None
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
            if event_type == "DELETED" and self.gated:
                self._changed.set()  # its GPUs may be free now (a victim reclaimed for a waiting claim, too)

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
        for write in list(self._writes):
            write.cancel()
        await self._drain()
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
        """Try every gated pod once, highest priority first, then oldest (kube-scheduler's queue order: the
        room a preemption made for a pod is not taken by one of lower priority waiting beside it); returns
        once every allocation it decided is written (so the next pass never decides again for a pod whose
        write is under way)."""
        classes = self._classes()
        slices = self._slices()
        pods = sorted(self.gated.values(), key=lambda p: (
            -priority_of(p), str((p.get("metadata") or {}).get("creationTimestamp", ""))))
        try:
            for pod in pods:
                if str(pod["metadata"].get("uid", "")) not in self.gated:
                    continue
                await self._tell(pod, await self._place(pod, classes, slices))
        finally:
            await self._drain()

    async def _tell(self, pod: Obj, waiting: str | None) -> None:
        """Record why the pod waits on it (one Event per change of reason)."""
        uid = str(pod["metadata"].get("uid", ""))
        if waiting and self.told.get(uid) != waiting:
            self.told[uid] = waiting
            m = pod["metadata"]
            await self.h.record_event(m.get("namespace", ""), m.get("name", ""), uid, "FailedScheduling",
                                      f"gpupool: {waiting}"[:1024], "Warning")

    async def _drain(self) -> None:
        while self._writes:
            await asyncio.wait(set(self._writes))

    def _classes(self) -> dict[str, tuple[str, list[Obj]]]:
        """gpupool's DeviceClasses: name -> (isolation, config)."""
        out = {}
        for c in self._class_ref.items():
            iso = class_isolation(c)
            if iso is not None:
                out[str(c["metadata"]["name"])] = (iso, list((c.get("spec") or {}).get("config") or []))
        return out

    def _slices(self) -> Usable:
        if self._usable is None:
            self._usable = usable_devices(self._slice_ref.items())
        return self._usable

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
        rules = pod_rules(pod)
        if rules:  # gpupool would pick a node kube-scheduler may then refuse for ever (the claim sits there)
            return await self._leave(pod, f"its rules about other pods ({', '.join(rules)})")
        claim, (ask,) = todo[0]
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

    async def _allocate(self, pod: Obj, claim: Obj, ask: ClaimAsk, cls: tuple[str, list[Obj]],
                        slices: Usable) -> str | None:
        """One framework cycle for the claim (the claim profile), then its allocation written."""
        isolation, config = cls
        gpus, names = slices.frozen("mig" if ask.mig_profile is not None else
                                    "remote" if isolation == REMOTE_ISOLATION else "shared")
        label = self._label(claim)
        cycle = self.fw.cycle(pod, Phase.CLAIM)
        cycle.claim = ClaimInCycle(str(claim["metadata"]["uid"]), label, ask, isolation, tuple(config), gpus,
                                   slices.agents())
        status, node = await self.fw.place(cycle, list(names))
        if node is None or cycle.allocation is None:
            # A PreFilter's refusal names the claim and what is wrong with it; other reasons say why it fits
            # nowhere now, in the framework's words for a pod.
            if status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
                return status.reason
            making = None if self.room is None else await self.room.make_room(cycle)
            return f"claim {shown(label)}: {status.reason}" + (f"; {making}" if making else "")
        self.h.pending.discard(cycle.key)
        allocation = cycle.allocation
        placed = [Placed(ask, mig_device_name(g.index, g.mig.profile, g.mig.start)) if g.mig is not None else
                  Placed(ask, device_name(g.index), g.memory_mib, 0 if g.milli < 10 else g.milli // 10,
                         str(uuid.uuid4())) for g in allocation.grants]
        status_obj = allocation_status(allocation.node, placed, {ask.device_class: config}, cycle.pod_node)
        while len(self._writes) >= MAX_WRITES:
            await asyncio.wait(set(self._writes), return_when=asyncio.FIRST_COMPLETED)
        write = asyncio.create_task(self._finish(pod, claim, status_obj, cycle, node, allocation.node, placed))
        self._writes.add(write)
        write.add_done_callback(self._writes.discard)
        return None  # the write tells why, should it fail

    async def _finish(self, pod: Obj, claim: Obj, status_obj: Obj, cycle: CycleState, node: str, gpu_node: str,
                      placed: list[Placed]) -> None:
        """Write the decided allocation and remove the pod's gate (beside the next claims' cycles)."""
        try:
            failed = await self._write(claim, status_obj)
            if failed is not None:
                await self.fw.unreserve(cycle, node)  # the ledger and the pod's node hold nothing for it
                await self._tell(pod, failed)
                return
            self.allocated += 1
            log.info("allocated claim %s of pod %s: %s %s%s", self._label(claim), pod_key(pod), gpu_node,
                     ", ".join(p.device for p in placed),
                     "" if cycle.pod_node in (None, gpu_node) else f" (remote: the pod runs on {cycle.pod_node})")
            await self._tell(pod, await self._ungate(pod))
        except Exception as e:  # as a failed pass: logged, the pod tried again by a later one
            log.warning("claim allocation of pod %s failed: %s", pod_key(pod), e)

    async def _write(self, claim: Obj, status: Obj) -> str | None:
        """Write the claim's allocation (the ledger already holds it); None, or why it could not be."""
        label = self._label(claim)
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
            return f"claim {shown(label)} could not be allocated: {e}"
        return None

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
