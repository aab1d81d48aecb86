"""gpupool as the allocator of its own DRA claims: pods whose claims ask for gpupool's DeviceClasses get
their node and GPUs from gpupool's placement policy, the same decision (and the same ledger) as a pod
asking through the device plugin, instead of kube-scheduler's first-fit allocator.

How it meets kube-scheduler (docs/claims.md, Placement): the webhook puts the scheduling gate
`gpu.gpupool.io/allocate` on such pods, so kube-scheduler leaves them alone. Here, once the pod's claims
exist (the resourceclaim controller makes them from their templates), the policy picks a node and GPUs
among the nodes that publish gpupool's ResourceSlice and that the pod may run on (its nodeSelector and
required node affinity, the nodes' NoSchedule/NoExecute taints, untainted devices), the ledger assumes
the share, the claim's `status.allocation` is written (results with consumedCapacity and a share ID, the
class's config, the node as nodeSelector), and the gate is removed. kube-scheduler then sees an
allocated claim: it can only place the pod on that node, reserves the claim for the pod and binds it,
running its own filters (CPU, affinity) as for any pod. A burst packs as the policy says, because every
decision is taken here, one at a time, against the ledger that already holds the previous ones.

A claim of the MIG class that names its profile with the selector
`device.attributes["gpu.gpupool.io"].profile == "<profile>"` gets the partition gpupool's MIG planning
chooses (core.mig_placement: the GPU and start slot that leave the least fragmentation for the profiles in
use), where kube-scheduler's allocator would take the first partition that fits.

A claim of a class with isolation `remote` (one GPU) gets a share in the GPU server of a GPU's node while
its pod may run on another node that runs gpupool's agent (whose agent mounts the forwarding library): the
GPU is chosen among the shared GPUs that publish `remoteServer`, on any node (the pod does not run there, so
its nodeSelector and the node's taints do not apply to the GPU node; the devices' taints do), preferring the
pod's own node, then a GPU node in a zone (`topology.kubernetes.io/zone`) of a node the pod may run on, then
any; the allocation names the GPU node's pool and devices and, as nodeSelector, the pod's node.

What gpupool does not decide is left to kube-scheduler's allocator, and the gate removed at once: claims of
other classes, claims with other CEL selectors (only kube-scheduler evaluates CEL), constraints, prioritized
lists or admin access, pods with several unallocated claims or requests, pods with required pod
(anti-)affinity or topology spread that may not be broken (they depend on every pod, which only
kube-scheduler weighs). Claims already allocated (a shared claim) need nothing. The ledger counts every
claim on gpupool's devices however it was allocated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np

from gpupool.api.dra import (
    ATTR_REMOTE_SERVER,
    DELETE_PROTECTION,
    DRIVER,
    REMOTE_ISOLATION,
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
from gpupool.api.preferences import pod_rules, required_affinity_allows, untolerated
from gpupool.api.quantity import QuantityError, bytes_to_mib, cpu_milli, parse_quantity
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
from gpupool.core.placement import Placement, Unschedulable, place
from gpupool.scheduler.framework.interface import Handle

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


@dataclass(frozen=True, slots=True)
class PodNode:
    """A node a remote share's pod may run on."""

    name: str
    zone: str | None  # its topology.kubernetes.io/zone label
    cpu_free: int | None  # milli-cores, at most what is free there (ClaimAllocator._headroom); None: unknown


RETRY_S = 5.0  # a pod that fits nowhere is tried again this often (and at once on any claim or pod change)
MAY_RUN = "its nodeSelector and node affinity, the nodes' taints"  # what _may_run reads, as the reasons say it
HARD_EFFECTS = ("NoSchedule", "NoExecute")  # taints that keep new pods (and claims) away; PreferNoSchedule does not
MAX_TEMPLATES_KNOWN = 10_000  # tenants name templates: what is remembered of them stays bounded
ZONE_LABEL = "topology.kubernetes.io/zone"  # a remote share prefers a GPU in the zone of its pod's node


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
        # Remote shares' pods: claim UID -> (the pod's node, its CPU milli-cores, its memory MiB). The ledger
        # holds the share on the GPU node and none of the pod's CPU or memory, so the pod nodes' headroom
        # subtracts these: a burst of remote pods spreads over the pod nodes instead of
        # all picking the one that looked roomiest. An entry goes with its claim's ledger entry.
        self.pod_holds: dict[str, tuple[str, int, int]] = {}
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
        return usable_devices(self._slice_ref.items())

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
        if ask.mig_profile is not None:
            return await self._allocate_mig(pod, claim, ask, classes[ask.device_class][1], slices)
        if classes[ask.device_class][0] == REMOTE_ISOLATION:
            return await self._allocate_remote(pod, claim, ask, classes[ask.device_class][1], slices)
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

    def _may_run(self, pod: Obj, name: str) -> bool:
        """Whether the pod may go to node `name` (its nodeSelector and required node affinity, the node's
        NoSchedule/NoExecute taints); a node the watch has not shown is not one it may go to."""
        obj = self.h.ledger.node_objs.get(name)
        if obj is None:
            return False
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        labels = (obj.get("metadata") or {}).get("labels") or {}
        hard = [t for t in (obj.get("spec") or {}).get("taints") or [] if t.get("effect") in HARD_EFFECTS]
        return (all(labels.get(k) == v for k, v in selector.items()) and required_affinity_allows(pod, obj)
                and not untolerated(pod, hard))

    def _allowed(self, pod: Obj, names: Iterable[str]) -> list[str]:
        """The nodes among `names` that the ledger knows (their GPUs) and the pod may go to."""
        return [n for n in names if n in self.h.ledger.state.index and self._may_run(pod, n)]

    def _decide(self, request: PodRequest, names: Iterable[str], usable: Mapping[str, set[int]],
                mps: bool) -> Placement | Unschedulable:
        """gpupool's placement policy on the GPUs `usable` of the ledger's nodes among `names`. The other GPUs
        of those nodes are excluded: tainted devices (or, for a remote share, GPUs without a server), and
        GPUs already shared by as many pods and claims as their node allows (the ledger would refuse the
        share there, while another GPU may be free)."""
        state = self.h.ledger.state
        nodes, excluded = [], set()
        for name in names:
            i = state.index[name]
            nodes.append(i)
            full = self.h.ledger.full(np.array([i], dtype=np.int64), mps)[0]
            excluded |= {g.uuid for g in state.nodes[i].gpus if g.index not in usable[name] or full[g.index]}
        request = replace(request, gpu=replace(request.gpu, exclude_uuids=frozenset(excluded)))
        return place(state, request, self.h.policy(request), self.h.context(), np.array(sorted(nodes), dtype=np.int64))

    @staticmethod
    def _share_request(pod: Obj, ask: ClaimAsk, spill_factor: Fraction) -> PodRequest:
        """The pod's request with the GPU share the claim asks for in place of any GPU of its own; its memory
        grows by what memory oversubscription may spill into the node's (which must have it beside the
        pod's)."""
        parsed = parse_pod(pod).request or PodRequest(key=pod_key(pod))
        whole = ask.memory_mib is None  # no memory asked: the request policy's default, the whole GPU
        gpu = GPURequest(count=ask.count, milli=MILLI_PER_GPU if whole else max(1, ask.cores * 10),
                         memory_mib=None if whole else ask.memory_mib)
        spill = 0 if ask.memory_mib is None else ask.count * oversub_mib(ask.memory_mib, spill_factor)
        return replace(parsed, memory_mib=parsed.memory_mib + spill, gpu=gpu)

    async def _allocate(self, pod: Obj, claim: Obj, ask: ClaimAsk, cls: tuple[str, list[Obj]],
                        slices: Usable) -> str | None:
        isolation, config = cls
        try:
            factor = class_oversubscription(config, self._label(claim))
        except ClaimError as e:
            return str(e)
        request = self._share_request(pod, ask, factor)
        nodes = self._allowed(pod, slices.shared)
        if not nodes:
            return f"no node that runs gpupool's DRA driver can take this pod ({MAY_RUN})"
        decided = self._decide(request, nodes, slices.shared, isolation == "mps")
        if isinstance(decided, Unschedulable):
            return f"claim {shown(self._label(claim))} fits on no GPU: {decided.summary()}"
        return await self._hold(pod, claim, ask, cls, request, decided.allocation, factor)

    async def _allocate_remote(self, pod: Obj, claim: Obj, ask: ClaimAsk, config: list[Obj],
                               slices: Usable) -> str | None:
        """A share in the GPU server of a GPU's node for a pod that runs on that node or another one (see the
        module doc): the first tier that places it wins, (a) a GPU on a node the pod may run on, the pod
        then runs there; (b) a GPU in the zone of a node the pod may run on, the pod on such a node; (c) any
        GPU with a server, the pod on any node it may run on. Within a tier gpupool's placement policy picks
        the GPU, as for any claim."""
        label = self._label(claim)
        if ask.count != 1:
            return (f"claim {shown(label)} asks for {ask.count} GPUs of isolation {REMOTE_ISOLATION}: a remote share "
                    "is served by one GPU (the forwarding library reaches one GPU server); ask for count 1")
        try:
            factor = class_oversubscription(config, label)
        except ClaimError as e:
            return str(e)
        request = self._share_request(pod, ask, factor)
        # Memory oversubscription spills into the memory of the GPU server's worker: the GPU node's, not the
        # pod node's.
        spill = 0 if ask.memory_mib is None else oversub_mib(ask.memory_mib, factor)
        hosts = self._pod_nodes(pod, slices.drivers, replace(request, memory_mib=request.memory_mib - spill))
        if not hosts:
            return f"no node that runs gpupool's agent can take this pod ({MAY_RUN}, its CPU and memory requests)"
        state = self.h.ledger.state
        servers = sorted(n for n, gpus in slices.remote.items() if gpus and n in state.index)
        if not servers:
            return f"claim {shown(label)}: no untainted GPU has a GPU server (device attribute {ATTR_REMOTE_SERVER})"
        host_names = {h.name for h in hosts}
        zones: dict[str, list[PodNode]] = {}
        for h in hosts:
            if h.zone is not None:
                zones.setdefault(h.zone, []).append(h)
        zone_of = {n: self._zone(n) for n in servers}
        # On another node than its pod the GPU node gives the GPU share (and the spill) only: the pod's CPU and
        # memory are the pod node's (kube-scheduler checks them there), so they do not count against it.
        alone = replace(request, cpu_milli=0, memory_mib=spill)
        # (GPU nodes, what they must give, the pod's node given the GPU's) per tier; on the same node the pod
        # runs with its share, so that node must have room for the pod's CPU and memory as well.
        tiers: list[tuple[list[str], PodRequest, Callable[[str], str]]] = [
            ([n for n in servers if n in host_names], request, lambda gpu_node: gpu_node),
            ([n for n in servers if zone_of[n] in zones], alone,
             lambda gpu_node: self._roomiest(zones[str(zone_of[gpu_node])])),
            (servers, alone, lambda gpu_node: self._roomiest(hosts)),
        ]
        refused: Unschedulable | None = None
        for names, wanted, pod_node_of in tiers:
            if not names:
                continue
            decided = self._decide(wanted, names, slices.remote, mps=False)
            if isinstance(decided, Placement):
                pod_node = pod_node_of(decided.allocation.node)
                self.pod_holds[str(claim["metadata"]["uid"])] = (pod_node, request.cpu_milli,
                                                                 request.memory_mib - spill)
                return await self._hold(pod, claim, ask, (REMOTE_ISOLATION, config), wanted, decided.allocation,
                                        factor, pod_node=pod_node)
            refused = decided
        assert refused is not None  # the last tier has every server
        return f"claim {shown(label)}: no GPU server has room for it: {refused.summary()}"

    def _zone(self, name: str) -> str | None:
        obj = self.h.ledger.node_objs.get(name) or {}
        zone = ((obj.get("metadata") or {}).get("labels") or {}).get(ZONE_LABEL)
        return None if zone is None else str(zone)

    def _pod_nodes(self, pod: Obj, names: Iterable[str], request: PodRequest) -> list[PodNode]:
        """The nodes among `names` (nodes running gpupool's agent) that a remote share's pod may run on, less
        those where its CPU or memory request clearly does not fit (see _headroom)."""
        out = []
        held = self._held_by_pods()
        for name in names:
            if not self._may_run(pod, name):
                continue
            room = self._headroom(name, held.get(name, (0, 0)))
            if room is not None and (room[0] < request.cpu_milli or room[1] < request.memory_mib):
                continue
            out.append(PodNode(name, self._zone(name), None if room is None else room[0]))
        return out

    def _held_by_pods(self) -> dict[str, tuple[int, int]]:
        """(CPU milli-cores, memory MiB) the pods of remote shares hold, by their node (pod_holds); the
        entries of claims that left the ledger are dropped first (their pods are gone)."""
        for uid in [u for u in self.pod_holds if u not in self.h.ledger.entries]:
            del self.pod_holds[uid]
        out: dict[str, tuple[int, int]] = {}
        for node, cpu, mem in self.pod_holds.values():
            have = out.get(node, (0, 0))
            out[node] = (have[0] + cpu, have[1] + mem)
        return out

    def _headroom(self, name: str, held: tuple[int, int]) -> tuple[int, int] | None:
        """(CPU milli-cores, memory MiB) at most free on a node, None when its Node does not say: its
        allocatable less what the ledger holds there (pods of gpupool's GPUs; claims hold none), from the
        ledger's state for a node it knows, else from the Node's allocatable (a GPU-less node without an
        inventory, where the ledger holds nothing), less `held` by the pods of remote shares placed there.
        Other pods are kube-scheduler's to count, so this can only over-estimate: a node it finds too small
        is too small."""
        state = self.h.ledger.state
        i = state.index.get(name)
        if i is not None:
            free = int(state.cpu_free[i]), int(state.mem_free[i])
        else:
            allocatable = ((self.h.ledger.node_objs[name].get("status") or {}).get("allocatable") or {})
            if "cpu" not in allocatable or "memory" not in allocatable:
                return None
            try:
                free = (cpu_milli(allocatable["cpu"]),
                        bytes_to_mib(parse_quantity(allocatable["memory"], "allocatable memory")[0], round_up=False))
            except QuantityError:
                return None
        return free[0] - held[0], free[1] - held[1]

    @staticmethod
    def _roomiest(nodes: Iterable[PodNode]) -> str:
        """The node with the most CPU free (an upper bound, see _headroom), nodes of unknown CPU last; ties
        by name, so that the choice is the same on every pass."""
        return min(nodes, key=lambda n: (n.cpu_free is None, -(n.cpu_free or 0), n.name)).name

    async def _hold(self, pod: Obj, claim: Obj, ask: ClaimAsk, cls: tuple[str, list[Obj]], request: PodRequest,
                    allocation: Allocation, factor: Fraction, pod_node: str | None = None) -> str | None:
        """Assume the claim's share in the ledger, then write its allocation (`pod_node`: where the pod runs,
        when not on the GPU's node)."""
        isolation, config = cls
        uid, label = str(claim["metadata"]["uid"]), self._label(claim)
        allocation = replace(allocation, pod=uid)
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
        status = allocation_status(allocation.node, devices, {ask.device_class: config}, pod_node)
        return await self._write(pod, claim, allocation, status, pod_node)

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
            return f"no GPU in MIG mode that this pod may use ({MAY_RUN})"
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

    async def _write(self, pod: Obj, claim: Obj, allocation: Allocation, status: Obj,
                     pod_node: str | None = None) -> str | None:
        """Write the claim's allocation (the ledger already holds it; forgotten if the write fails), then
        ungate the pod (`pod_node`: where it runs, when not on its devices' node)."""
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
        log.info("allocated claim %s of pod %s: %s %s%s", label, pod_key(pod), allocation.node,
                 ", ".join(r["device"] for r in status["devices"]["results"]),
                 "" if pod_node in (None, allocation.node) else f" (remote: the pod runs on {pod_node})")
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
