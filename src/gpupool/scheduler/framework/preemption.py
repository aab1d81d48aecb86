"""The framework's preemption evaluator (kube-scheduler's DefaultPreemption evaluator, scheduler-plugins'
shared one): candidates, victims, disruption budgets and what-ifs, for every plugin and verb that makes room
for a pod. The `queue_reclaim` PostFilter (gpupool's own reclaim) and the extender's preempt verb
(kube-scheduler's preemption, checked for GPU shares) both feed it; neither knows the other.

- Candidates: the confirmed ledger entries on the nodes in question, as gpupool.core.preemption sees them
  (`Running`: queue, priority, charge, start, whether its compute can be squeezed), leaving out pods already
  asked to go, pods being deleted and pods a PodDisruptionBudget protects for now (`block`).
- Victims: gpupool.core.preemption chooses (plan_preemption, plan_squeeze, victim_reason); whether the pod
  then fits is asked of a snapshot of the ledger (gpupool.scheduler.what_if), never of the live state.
- In flight: the victims chosen for a pod and the squeezes being written for it. While they are going the
  pod is `waiting_for` them, and no one chooses more for it (kube-scheduler's PodEligibleToPreemptOthers).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from gpupool.api.extender import MetaPod, MetaVictims
from gpupool.cluster.port import Obj
from gpupool.core.model import PodRequest
from gpupool.core.preemption import (
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


def candidate(cache: QueueCache, entry: Entry, pod: Obj | None, memory: Mapping[str, int]) -> Running:
    """A ledger entry as a possible victim: its queue, priority, charge and start (from its pod)."""
    return Running(entry.uid, entry.key, cache.queue_of(namespace_of(entry.key)), entry.allocation.node,
                   priority_of(pod), charge_of_allocation(entry.allocation, memory), _started(pod),
                   squeezable=can_squeeze(pod), shares=shares_of(entry, memory))


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
            pod = self.handle.pods.get(uid)
            if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue
            out.append(candidate(cache, entry, pod, memory))
        return out

    @staticmethod
    def preemptor(cache: QueueCache, cycle: CycleState) -> Preemptor:
        assert cycle.request is not None
        return Preemptor(cycle.uid, cache.queue_of(namespace_of(cycle.key)), priority_of(cycle.pod),
                         charge_of_request(cycle.request.gpu, cache.largest_gpu_mib()))

    # --- choosing (each on one snapshot of the ledger) --------------------------------------------------

    def choose(self, cycle: CycleState, nodes: frozenset[str], now: float) -> tuple[Preemptor, Plan] | None:
        """The victims for the pod on `nodes`, pods already being evicted counted as gone."""
        cache = self.handle.queues
        assert cache is not None and cycle.request is not None
        going = self.going()
        running = self.running(cache, set(nodes), now)
        preemptor = self.preemptor(cache, cycle)
        usage = cache.usage(without=cycle.holder, gone=going)
        snapshot, request = Snapshot(self.handle.ledger), cycle.request
        plan = plan_preemption(cache.queues.tree, usage, preemptor, running,
                               lambda node, victims: snapshot.fits(request, node, victims | going), now)
        return None if plan is None else (preemptor, plan)

    def choose_squeeze(self, cycle: CycleState, nodes: frozenset[str],
                       now: float) -> tuple[Preemptor, SqueezePlan] | None:
        """Compute squeezes that make room for the pod on one of `nodes` (no eviction), or None."""
        cache = self.handle.queues
        assert cache is not None and cycle.request is not None
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
        out: dict[str, MetaVictims] = {}
        for node, victims in proposals.items():
            uids = [m.UID for m in victims.Pods]
            on_node = {u for u in uids if u in ledger.entries and ledger.entries[u].allocation.node == node}
            if queues is not None and queues.enabled:
                on_node = self._allowed(queues, cycle, request, on_node)
            if not snapshot.fits(request, node, on_node):
                continue
            keep = set(on_node)
            for uid in sorted(on_node, key=lambda u: (-priority_of(self.handle.pods.get(u)), u)):
                if snapshot.fits(request, node, keep - {uid}):
                    keep.discard(uid)
            chosen = [u for u in uids if u in keep or u not in ledger.entries]
            if chosen:
                out[node] = MetaVictims(Pods=[MetaPod(UID=u) for u in chosen],
                                        NumPDBViolations=victims.NumPDBViolations)
        return out

    def _allowed(self, cache: QueueCache, cycle: CycleState, request: PodRequest, proposed: set[str]) -> set[str]:
        """The proposed GPU holders gpupool's queue rules let this pod take."""
        tree, memory = cache.queues.tree, cache.gpu_memory()
        usage = cache.usage(without=cycle.holder)
        preemptor = self.preemptor(cache, cycle)
        reclaims = in_quota(tree, usage, preemptor)
        allowed: set[str] = set()
        for victim_uid in sorted(proposed):
            running = candidate(cache, self.handle.ledger.entries[victim_uid], self.handle.pods.get(victim_uid),
                                memory)
            if victim_reason(tree, usage, preemptor, running, reclaims) is not None:
                allowed.add(victim_uid)
                usage[running.queue] = usage[running.queue] - running.charge
        return allowed
