"""The framework's preemption evaluator (kube-scheduler's DefaultPreemption evaluator, scheduler-plugins'
shared one): candidates, victims, disruption budgets and what-ifs, for every plugin and verb that makes room
for a pod. The `queue_reclaim` PostFilter (gpupool's own reclaim) and the extender's preempt verb
(kube-scheduler's preemption, checked for GPU shares) both feed it; neither knows the other.

- Candidates: the confirmed ledger entries on the nodes in question, as gpupool.core.preemption sees them
  (`Running`: queue, priority, charge, start, whether its compute can be squeezed), leaving out pods already
  asked to go, pods being deleted and pods a PodDisruptionBudget protects for now (`block`). One rule for
  both forms (`Evaluator.candidate`): a pod's share is freed by evicting that pod; a DRA claim's share by
  evicting the pods that use the claim (Ledger.claim_users: the pod that owns a claim made from its template,
  which goes with it, or every pod a shared claim is reserved for), and it carries their priority (the
  highest), queue (the claim's namespace's) and start (the earliest). A claim with no known pod, or with one
  being deleted, is no candidate; nor is a claim share's compute squeezed (its limits are the claim's).
- Victims: gpupool.core.preemption chooses (plan_preemption, plan_squeeze, victim_reason); whether the pod
  then fits is asked of a snapshot of the ledger (gpupool.scheduler.what_if), never of the live state.
- In flight: the victims chosen for a pod and the squeezes being written for it. While they are going the
  pod is `waiting_for` them, and no one chooses more for it (kube-scheduler's PodEligibleToPreemptOthers).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING

from gpupool.api.extender import MetaPod, MetaVictims
from gpupool.api.pod import pod_key
from gpupool.cluster.port import Obj
from gpupool.core.preemption import (
    NO_QUEUE,
    NO_QUEUES,
    Plan,
    Preemptor,
    Running,
    SqueezePlan,
    in_quota,
    plan_preemption,
    plan_squeeze,
    victim_reason,
)
from gpupool.core.queues import charge_of_allocation, charge_of_request
from gpupool.scheduler.framework.cycle import CycleState
from gpupool.scheduler.ledger import Entry
from gpupool.scheduler.queues import QueueCache, namespace_of
from gpupool.scheduler.squeeze import can_squeeze, fits_squeezed, shares_of
from gpupool.scheduler.what_if import Snapshot

if TYPE_CHECKING:
    from gpupool.scheduler.framework.interface import Handle

MAX_WAITING = 4096  # preemptors remembered with victims in flight (the oldest forgotten first)


def priority_of(pod: Obj | None) -> int:
    value = ((pod or {}).get("spec") or {}).get("priority")
    return int(value) if isinstance(value, int) else 0


def _started(pod: Obj | None) -> float:
    text = ((pod or {}).get("status") or {}).get("startTime") or ((pod or {}).get("metadata") or {}).get(
        "creationTimestamp")
    if not text:
        return 0.0
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def preempts(pod: Obj | None) -> bool:
    """Whether the pod may take from others (kube-scheduler's rule: not with `preemptionPolicy: Never`, which
    a non-preempting PriorityClass gives its pods)."""
    return ((pod or {}).get("spec") or {}).get("preemptionPolicy") != "Never"


class Evaluator:
    def __init__(self, handle: Handle) -> None:
        self.handle = handle
        self._waiting: OrderedDict[str, tuple[frozenset[str], float]] = OrderedDict()  # preemptor -> (victims, until)
        self._evicted: set[str] = set()  # victims once asked to go (never twice)
        self._blocked: dict[str, float] = {}  # victim uid -> until when a budget protects it
        self._squeezing: dict[str, frozenset[str]] = {}  # preemptor -> pods whose squeeze is being written

    # --- in flight ------------------------------------------------------------------------------------

    def waiting_for(self, uid: str, now: float | None = None) -> bool:
        """True while the victims chosen for this pod are still going, or its squeezes being written (no
        one may choose more for it meanwhile)."""
        if uid in self._squeezing:
            return True  # its squeezes are being written: the next cycle sees the room they make
        waiting = self._waiting.get(uid)
        if waiting is None:
            return False
        victims, until = waiting
        gone = all(v not in self.handle.ledger.entries for v in victims)
        if gone or (self.handle.clock() if now is None else now) > until:
            del self._waiting[uid]
            return False
        return True

    def evicting(self, preemptor: str, victims: frozenset[str], now: float, wait_s: float) -> None:
        """`victims` are being evicted for `preemptor`, which waits for them at most `wait_s`."""
        self._waiting[preemptor] = (victims, now + wait_s)
        while len(self._waiting) > MAX_WAITING:
            self._waiting.popitem(last=False)
        self._evicted |= victims

    def abandon(self, preemptor: str, victims: frozenset[str]) -> None:
        """The plan for `preemptor` stops: `victims` were not evicted, and it no longer waits."""
        self._evicted -= victims
        self._waiting.pop(preemptor, None)

    def not_evicted(self, victim: str) -> None:
        self._evicted.discard(victim)

    def block(self, victim: str, until: float) -> None:
        """Its PodDisruptionBudget allows no disruption now: not a candidate until `until`."""
        self._blocked[victim] = until

    def squeezing(self, preemptor: str, pods: frozenset[str]) -> None:
        self._squeezing[preemptor] = pods

    def squeezed(self, preemptor: str) -> None:
        self._squeezing.pop(preemptor, None)

    def going(self) -> frozenset[str]:
        """Pods asked to go that still hold their capacity."""
        return frozenset(u for u in self._evicted if u in self.handle.ledger.entries)

    # --- candidates -----------------------------------------------------------------------------------

    def users(self, entry: Entry) -> tuple[str, ...]:
        """The UIDs of the pods whose eviction frees `entry`'s share: the pod itself, or the claim's users."""
        return self.handle.ledger.claim_users(entry.uid) if entry.claim else (entry.uid,)

    def candidate(self, cache: QueueCache, entry: Entry, memory: Mapping[str, int]) -> Running | None:
        """A ledger entry as a possible victim, or None when no eviction can free it: the pods that hold it
        (the pod itself, or the pods using the claim) are all known and none is being deleted; it carries
        their queue, highest priority and earliest start (the module doc says why)."""
        uids = self.users(entry)
        pods = [self.handle.pods.get(u) for u in uids]
        known = [p for p in pods if p is not None and not (p.get("metadata") or {}).get("deletionTimestamp")]
        if not known or len(known) != len(uids):
            return None
        return Running(entry.uid, entry.key, cache.queue_of(namespace_of(entry.key)), entry.allocation.node,
                       max(priority_of(p) for p in known), charge_of_allocation(entry.allocation, memory),
                       min(_started(p) for p in known), squeezable=not entry.claim and can_squeeze(known[0]),
                       shares=shares_of(entry, memory),
                       pods=tuple((pod_key(p), u) for p, u in zip(known, uids, strict=True)) if entry.claim else ())

    def running(self, cache: QueueCache, nodes: set[str], now: float) -> list[Running]:
        """The possible victims on `nodes`: confirmed entries, not asked to go, not protected by a budget,
        their pods alive and not being deleted."""
        memory = cache.gpu_memory()
        out: list[Running] = []
        for uid, entry in self.handle.ledger.confirmed().items():
            if entry.allocation.node not in nodes or uid in self._evicted:
                continue
            if self._blocked.get(uid, 0.0) > now:
                continue
            victim = self.candidate(cache, entry, memory)
            if victim is not None:
                out.append(victim)
        return out

    @staticmethod
    def preemptor(cache: QueueCache, cycle: CycleState) -> Preemptor:
        assert cycle.request is not None
        return Preemptor(cycle.uid, cache.queue_of(namespace_of(cycle.key)), priority_of(cycle.pod),
                         charge_of_request(cycle.request.gpu, cache.largest_gpu_mib()), preempts(cycle.pod))

    # --- choosing (each on one snapshot of the ledger) --------------------------------------------------

    def choose(self, cycle: CycleState, nodes: frozenset[str], now: float) -> tuple[Preemptor, Plan] | None:
        """The victims for the pod on `nodes`, pods already being evicted counted as gone. Without team
        queues, priority alone decides (gpupool.core.preemption.NO_QUEUES; the queue_reclaim plugin asks so
        only for a claim's pod)."""
        cache = self.handle.queues
        assert cache is not None and cycle.request is not None
        going = self.going()
        running = self.running(cache, set(nodes), now)
        preemptor = self.preemptor(cache, cycle)
        tree, usage = cache.queues.tree, cache.usage(without=cycle.holder, gone=going)
        if not cache.enabled:
            running = [replace(r, queue=NO_QUEUE) for r in running]
            preemptor, tree, usage = replace(preemptor, queue=NO_QUEUE), NO_QUEUES, {}
        snapshot, request = Snapshot(self.handle.ledger), cycle.request
        plan = plan_preemption(tree, usage, preemptor, running,
                               lambda node, victims: snapshot.fits(request, node, victims | going), now)
        return None if plan is None else (preemptor, plan)

    def choose_squeeze(self, cycle: CycleState, nodes: frozenset[str],
                       now: float) -> tuple[Preemptor, SqueezePlan] | None:
        """Compute squeezes that make room for the pod on one of `nodes` (no eviction), or None (always
        without team queues: only a reclaim squeezes)."""
        cache = self.handle.queues
        assert cache is not None and cycle.request is not None
        if not cache.enabled:
            return None
        going = self.going()
        busy = frozenset(u for uids in self._squeezing.values() for u in uids)
        running = [r for r in self.running(cache, set(nodes), now) if r.uid not in busy]
        preemptor = self.preemptor(cache, cycle)
        usage = cache.usage(without=cycle.holder, gone=going)
        snapshot, request = Snapshot(self.handle.ledger), cycle.request
        plan = plan_squeeze(cache.queues.tree, usage, preemptor, running,
                            lambda node, squeezes: fits_squeezed(snapshot, request, node, squeezes), now)
        return None if plan is None else (preemptor, plan)

    def trim(self, cycle: CycleState, proposals: Mapping[str, MetaVictims]) -> dict[str, MetaVictims]:
        """kube-scheduler's proposed victims per node, cut to those that make room for the pod's GPU share
        (gpupool.scheduler.preempt_verb says the rules); nodes where none would are dropped."""
        proposals = {n: v for n, v in proposals.items() if v.NumPDBViolations == 0}
        if self.waiting_for(cycle.uid):
            return {}
        request = cycle.request
        if request is None or request.gpu.count == 0:
            return dict(proposals)  # no GPU share: nothing to judge
        ledger, queues = self.handle.ledger, self.handle.queues
        snapshot = Snapshot(ledger)
        held: dict[str, list[Entry]] = {}  # the shares on the proposals' nodes
        for entry in ledger.entries.values():
            if entry.allocation.node in proposals:
                held.setdefault(entry.allocation.node, []).append(entry)
        out: dict[str, MetaVictims] = {}
        for node, victims in proposals.items():
            uids = [m.UID for m in victims.Pods]
            proposed = set(uids)
            # The shares on the node that the proposed pods free (a claim's only when all its users are
            # proposed), and the pods that hold a share there at all.
            frees: dict[str, tuple[str, ...]] = {}
            holders: set[str] = set()
            for entry in held.get(node, ()):
                users = self.users(entry)
                holders.update(users)
                if users and proposed.issuperset(users):
                    frees[entry.uid] = users
            on_node = set(frees)
            if queues is not None and queues.enabled:
                on_node = self._allowed(queues, cycle, on_node)
            if not snapshot.fits(request, node, on_node):
                continue
            keep = set(on_node)
            for uid in sorted(on_node, key=lambda u: (-max(priority_of(self.handle.pods.get(p)) for p in frees[u]), u)):
                if snapshot.fits(request, node, keep - {uid}):
                    keep.discard(uid)
            kept = {p for u in keep for p in frees[u]}
            chosen = [u for u in uids if u in kept or u not in holders]
            if chosen:
                out[node] = MetaVictims(Pods=[MetaPod(UID=u) for u in chosen],
                                        NumPDBViolations=victims.NumPDBViolations)
        return out

    def _allowed(self, cache: QueueCache, cycle: CycleState, proposed: set[str]) -> set[str]:
        """The proposed shares (ledger entries) gpupool's queue rules let this pod take."""
        tree, memory = cache.queues.tree, cache.gpu_memory()
        usage = cache.usage(without=cycle.holder)
        preemptor = self.preemptor(cache, cycle)
        reclaims = in_quota(tree, usage, preemptor)
        allowed: set[str] = set()
        for victim_uid in sorted(proposed):
            running = self.candidate(cache, self.handle.ledger.entries[victim_uid], memory)
            if running is not None and victim_reason(tree, usage, preemptor, running, reclaims) is not None:
                allowed.add(victim_uid)
                usage[running.queue] = usage[running.queue] - running.charge
        return allowed
