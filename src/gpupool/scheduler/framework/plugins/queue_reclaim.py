"""PostFilter `queue_reclaim`: when a GPU pod fits no node, take capacity back for it: from queues that
borrowed beyond their guarantee (reclaim, for a pod within its own queue's guarantee) or, inside its queue,
from pods of lower priority. Victims are chosen by gpupool.core.preemption (fewest pods, lowest priority,
least run time lost, on the node where the pod then fits) and evicted through the Eviction API, so
PodDisruptionBudgets hold: a victim whose budget says no (429) is left alone for `blocked_s` and the next
cycle chooses others. The pod that fits nowhere may be a pod or a claim's pod (the claim profile runs this
plugin too), and a victim a pod's share or a claim's: a claim's share is taken by evicting every pod that
uses the claim (the evaluator's rule), each recorded. Without team queues the plugin acts for a claim's pod
only, by priority alone: a pod's preemption is then kube-scheduler's, which never sees a gated claim pod.

Time-sharing first: for a reclaim, borrowed shares served by the interception library are squeezed
(their compute lowered, gpupool.scheduler.squeeze) when that makes room, and nothing is evicted; eviction is
the fallback when no squeeze can (memory cannot be squeezed). `squeeze: false` turns this off.

Never a loop: while the victims chosen for a pod are still terminating it chooses none again (their GPUs
come back through the watch and kube-scheduler's retry of the pod takes them), a pod is never evicted twice,
and core's rules make a reclaim unanswerable by a reclaim back. Each eviction is recorded on both pods as
an Event. Only confirmed allocations (pods bound and seen by the watch) are candidates.

Choosing is the framework's preemption evaluator's (gpupool.scheduler.framework.preemption: candidates,
budgets, victims in flight, what-ifs on a snapshot of the ledger); this plugin decides when to ask it and
carries out its plans (evictions, squeezes, events).
"""

from __future__ import annotations

import asyncio
import logging
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from gpupool.api.logsafe import shown
from gpupool.api.squeeze import ANN_ROOM_MADE
from gpupool.api.times import format_time
from gpupool.cluster.port import ApiError, Conflict, NotFound, TooManyRequests
from gpupool.core.preemption import Plan, Preemptor, SqueezePlan, Victim
from gpupool.scheduler.framework.cycle import CycleState, NodeSet
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import SUCCESS, Status
from gpupool.scheduler.squeeze import squeeze_pod

log = logging.getLogger(__name__)


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    blocked_s: float = Field(default=30.0, gt=0)  # a victim a disruption budget protected is skipped this long
    waiting_s: float = Field(default=120.0, gt=0)  # the longest a pod waits for its victims to go
    squeeze: bool = True  # squeeze borrowed hook shares' compute before evicting anything


class QueueReclaim:
    name: ClassVar[str] = "queue_reclaim"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle
        self.args = args
        self.evaluator = handle.preemption
        self._tasks: set[asyncio.Task[None]] = set()
        self._marks = 0  # room-made notes written (each one distinct)
        self.plans: list[Plan] = []  # the latest plans (bounded), for tests and the debug view
        self.squeezes: list[SqueezePlan] = []  # likewise, the latest squeezes

    def post_filter(self, cycle: CycleState, nodes: NodeSet) -> Status:
        cache = self.handle.queues
        if cache is None or cycle.request is None:
            return SUCCESS
        if not cache.enabled and cycle.claim is None:
            # Without team queues a pod's preemption is kube-scheduler's (the preempt verb judges its victims).
            # A claim's pod waits behind its scheduling gate, which kube-scheduler's preemption never sees: for
            # it, priority alone decides here (the evaluator's choice without queues).
            return SUCCESS
        now = self.handle.clock()
        if self.evaluator.waiting_for(cycle.uid, now):
            return SUCCESS
        # Only nodes that did not fit for now (not those that never can) may be freed.
        state = self.handle.ledger.state
        candidates = frozenset(n for n in nodes.failed if n in state.index)
        if not candidates:
            return SUCCESS
        squeeze = self.evaluator.choose_squeeze(cycle, candidates, now) if self.args.squeeze else None
        if squeeze is not None:
            self._start_squeeze(cycle, *squeeze, now)
            return SUCCESS
        chosen = self.evaluator.choose(cycle, candidates, now)
        if chosen is not None:
            self._start(cycle, candidates, *chosen, now)
        return SUCCESS

    def _start_squeeze(self, cycle: CycleState, preemptor: Preemptor, plan: SqueezePlan, now: float) -> None:
        self.evaluator.squeezing(cycle.uid, frozenset(s.pod.uid for s in plan.squeezes))
        self.squeezes = [*self.squeezes[-31:], plan]
        log.info("%s: squeezing %s on %s", cycle.key,
                 ", ".join(f"{s.pod.key} to {s.milli / 10:g} %" for s in plan.squeezes), plan.node)
        task = asyncio.get_running_loop().create_task(self._squeeze(cycle, preemptor, plan, now))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _squeeze(self, cycle: CycleState, preemptor: Preemptor, plan: SqueezePlan, now: float) -> None:
        done = 0
        try:
            for sq in plan.squeezes:
                pod = self.handle.pods.get(sq.pod.uid)
                if pod is None or await squeeze_pod(self.handle.cluster, self.handle.ledger, pod, sq.milli,
                                                    now) is None:
                    continue  # gone or changed: the pod's next cycle decides again
                done += 1
                await self._event(sq.pod.key, sq.pod.uid, "Squeezed", sq.message(preemptor))
                await self._event(cycle.key, cycle.uid, "Squeezing",
                                  f"squeezed {sq.pod.key} on {sq.pod.node} to {sq.milli / 10:g} % compute (reclaim)")
        finally:
            self.evaluator.squeezed(cycle.uid)
        if done:
            namespace, name = cycle.key.split("/", 1)
            # kube-scheduler retries a pending pod when it changes (gpupool.api.squeeze.ANN_ROOM_MADE): the value
            # must differ from the last one (the same second twice would be a no-op patch, and no retry).
            self._marks += 1
            note = f"{format_time(now)} #{self._marks}: squeezed {', '.join(s.pod.key for s in plan.squeezes)}"
            try:
                await self.handle.cluster.patch_pod_annotations(namespace, name, {ANN_ROOM_MADE: shown(note, 1000)})
            except ApiError as e:
                log.info("%s: room made, but the pod could not be marked for a retry: %s", cycle.key, e)

    def _start(self, cycle: CycleState, candidates: frozenset[str], preemptor: Preemptor, plan: Plan,
               now: float) -> None:
        self._remember(cycle, plan, now)
        task = asyncio.get_running_loop().create_task(self._evict(cycle, candidates, preemptor, plan))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _remember(self, cycle: CycleState, plan: Plan, now: float) -> None:
        self.evaluator.evicting(cycle.uid, frozenset(v.pod.uid for v in plan.victims), now, self.args.waiting_s)
        self.plans = [*self.plans[-31:], plan]
        log.info("%s: evicting %s on %s", cycle.key,
                 ", ".join(key for v in plan.victims for key, _ in v.pod.evicted), plan.node)

    async def _evict(self, cycle: CycleState, candidates: frozenset[str], preemptor: Preemptor, plan: Plan,
                     tries: int = 3) -> None:
        for k, victim in enumerate(plan.victims):
            # A claim's share goes with the pods that use it (the claim made from a pod's template is deleted
            # with its pod by Kubernetes' resourceclaim controller; a shared claim is deallocated once none of
            # its pods remains): evicting them is all there is to do, as for a pod's own share.
            key, uid = victim.pod.evicted[0]  # the pod being evicted (the one a refusal names)
            try:
                for key, uid in victim.pod.evicted:
                    await self._evict_pod(cycle, preemptor, victim, key, uid)
            except TooManyRequests:
                now = self.handle.clock()
                self.evaluator.block(victim.pod.uid, now + self.args.blocked_s)
                # The rest of this plan is no longer needed as such: choose again without the protected pod
                # (those already evicted count as gone), now rather than at the pod's next cycle.
                self.evaluator.abandon(cycle.uid, frozenset(v.pod.uid for v in plan.victims[k:]))
                await self._event(key, uid, "PreemptionBlocked",
                                  f"not evicted for {cycle.key}: its PodDisruptionBudget allows no disruption now")
                again = self.evaluator.choose(cycle, candidates, now) if tries > 1 else None
                if again is not None:
                    self._remember(cycle, again[1], now)
                    await self._evict(cycle, candidates, preemptor, again[1], tries - 1)
                return
            except ApiError as e:
                log.warning("evicting %s for %s failed: %s", key, cycle.key, e)
                self.evaluator.not_evicted(victim.pod.uid)
                continue

    async def _evict_pod(self, cycle: CycleState, preemptor: Preemptor, victim: Victim, key: str, uid: str) -> None:
        """Evict one pod of `victim` and record it; a pod gone or replaced meanwhile is no error (its share
        comes back anyway). TooManyRequests (its budget) and other API errors are the caller's."""
        namespace, name = key.split("/", 1)
        try:
            await self.handle.cluster.evict_pod(namespace, name, uid)
        except (NotFound, Conflict):
            return
        await self._record(cycle, preemptor, victim, key, uid)

    async def _record(self, cycle: CycleState, preemptor: Preemptor, victim: Victim, key: str, uid: str) -> None:
        claim = f"; its claim {victim.pod.key}" if victim.pod.pods else ""
        await self._event(key, uid, "Preempted", victim.message(preemptor) + claim)
        await self._event(cycle.key, cycle.uid, "Preempting",
                          f"evicted {key} on {victim.pod.node} ({victim.reason}{claim})")

    async def _event(self, key: str, uid: str, reason: str, message: str) -> None:
        namespace, name = key.split("/", 1)
        await self.handle.record_event(namespace, name, uid, reason, shown(message, 1000),
                                       "Normal" if reason == "Preempting" else "Warning")
