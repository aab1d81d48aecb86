"""PreFilter / Reserve / Unreserve `nominate`: GPUs reserved for the pod a cycle is about to bind.

kube-scheduler binds asynchronously and filters the next pods meanwhile. So that those filters see the GPUs
about to be taken, the scheduling cycle reserves the winner's GPUs (prioritize's winner, or filter's only
node left, as kube-scheduler then skips prioritize) as an *assumed* ledger entry with a short deadline
(`nominate_timeout_s`). The bind takes it over (its deadline becomes `assume_timeout_s`); a bind to
another node, a new scheduling cycle of the same pod (PreFilter), its deletion or the deadline drop it.

Bounded, because anyone who can reach the extender can ask for nominations: only for a pod that exists
and waits for a node (the cache and `pod_pending` said so), one per pod at a time, at most
`max_per_pod` per pod within `window_s`, and at most `max_nominations` at once in total. Past a bound
the cycle goes on without a reservation (its bind still decides against the ledger, so nothing can be
overcommitted; the pod just loses the head start).

And bounded in time, so that pods which are filtered but never bound cannot starve the others (issue 26:
8 whole-GPU pods re-sent to /filter every 8 s kept an 8-GPU node reserved, and a real pod was refused
24 times in 45 s): a pod that has not bound holds nominations for at most `max_unbound_s` in any
`unbound_window_s`, counted from its first nomination since it last bound. Re-filtering it does not renew
the time: a later nomination ends when the first one's time is up, and after that it gets none until the
window has passed. A bind that takes the reservation over ends the count. A pod bound within its first
`max_unbound_s` (every pod kube-scheduler binds at once) never meets the rule.

In the binding cycle, Reserve keeps the pod's reservation on the bind's node, or decides the GPUs on that
node now (after the Filter plugins passed it) and assumes them; the ledger refuses anything over capacity
or over a GPU's pod limit.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from gpupool.api.isolation import IsolationMode
from gpupool.core.model import Allocation, PodRequest
from gpupool.scheduler.framework.choice import gpus_on
from gpupool.scheduler.framework.cycle import CycleState, Phase
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import SUCCESS, Status, unschedulable

log = logging.getLogger(__name__)


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    nominate_timeout_s: float = Field(default=10.0, gt=0)
    assume_timeout_s: float = Field(default=30.0, gt=0)
    max_nominations: int = Field(default=512, ge=0)
    max_per_pod: int = Field(default=20, ge=1)
    window_s: float = Field(default=60.0, gt=0)
    max_unbound_s: float = Field(default=10.0, gt=0)
    unbound_window_s: float = Field(default=300.0, gt=0)


class Nominate:
    name: ClassVar[str] = "nominate"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle
        self.args = args
        self._active: OrderedDict[str, float] = OrderedDict()  # pod UID -> deadline of its nomination
        self._recent: OrderedDict[str, tuple[float, int]] = OrderedDict()  # pod UID -> (window start, count)
        # pod UID -> its first nomination since it last bound (the reservation time rule above)
        self._unbound: OrderedDict[str, float] = OrderedDict()
        self.refused = 0  # nominations skipped over a bound (tests and logs)

    @property
    def active(self) -> int:
        self._prune(self.handle.clock())
        return len(self._active)

    # --- PreFilter: a new scheduling cycle voids the previous one's reservation ------------------------

    def pre_filter(self, cycle: CycleState) -> Status:
        if cycle.phase is Phase.BIND:
            return SUCCESS
        ledger = self.handle.ledger
        # (While a bind of the pod runs, even one kube-scheduler gave up waiting for, its reservation stays.)
        if cycle.uid in ledger.entries and cycle.uid not in self.handle.binding:
            ledger.forget(cycle.uid)
            self._active.pop(cycle.uid, None)
        return SUCCESS

    # --- Reserve ---------------------------------------------------------------------------------------

    def reserved(self, cycle: CycleState, node: str) -> bool:
        entry = self.handle.ledger.entries.get(cycle.uid)
        return entry is not None and entry.allocation.node == node

    def reserve(self, cycle: CycleState, node: str) -> Status:
        if cycle.phase is Phase.BIND:
            return self._assume(cycle, node)
        self._nominate(cycle, node)
        return SUCCESS

    async def unreserve(self, cycle: CycleState, node: str) -> None:
        self.handle.ledger.forget(cycle.uid)
        self._active.pop(cycle.uid, None)

    def _assume(self, cycle: CycleState, node: str) -> Status:
        ledger, now = self.handle.ledger, self.handle.clock()
        self._active.pop(cycle.uid, None)  # from now on a bind's reservation, not a nomination
        self._unbound.pop(cycle.uid, None)  # it binds: its nominations did their job
        entry = ledger.entries.get(cycle.uid)
        if entry is not None and entry.allocation.node == node:
            entry.deadline = now + self.args.assume_timeout_s  # a retried bind finds its own reservation
            cycle.allocation = entry.allocation
            return SUCCESS
        if entry is not None:
            ledger.forget(cycle.uid)
        allocation = self._place(cycle, node)
        if allocation is None:
            return unschedulable(f"pod {cycle.key} does not fit on {node}")
        refused = ledger.assume(cycle.uid, cycle.key, self._request(cycle), allocation,
                                now + self.args.assume_timeout_s, mps=self._mps(cycle))
        if refused is not None:
            return unschedulable(f"pod {cycle.key} cannot be reserved on {node}: {refused}")
        cycle.allocation = ledger.entries[cycle.uid].allocation
        return SUCCESS

    def _nominate(self, cycle: CycleState, node: str) -> None:
        now = self.handle.clock()
        self._prune(now)
        start, count = self._recent.pop(cycle.uid, (now, 0))
        if not 0 <= now - start < self.args.window_s:  # a new window (or the wall clock went back)
            start, count = now, 0
        self._recent[cycle.uid] = (start, count)
        while len(self._recent) > 4 * max(self.args.max_nominations, 1):
            self._recent.popitem(last=False)
        first = self._unbound.pop(cycle.uid, now)
        if not 0 <= now - first < self.args.unbound_window_s:  # a new window (or the wall clock went back)
            first = now
        self._unbound[cycle.uid] = first
        while len(self._unbound) > 4 * max(self.args.max_nominations, 1):
            self._unbound.popitem(last=False)
        ends = first + self.args.max_unbound_s
        if count >= self.args.max_per_pod or len(self._active) >= self.args.max_nominations or now >= ends:
            self.refused += 1
            log.debug("no nomination for %s: over its bounds", cycle.key)
            return
        allocation = self._place(cycle, node)
        if allocation is None:
            return
        deadline = min(now + self.args.nominate_timeout_s, ends)
        if self.handle.ledger.assume(cycle.uid, cycle.key, self._request(cycle), allocation, deadline,
                                     mps=self._mps(cycle)) is None:
            self._recent[cycle.uid] = (start, count + 1)
            self._active[cycle.uid] = deadline
            cycle.allocation = allocation
            self.handle.busy.nominated(cycle.uid, node, deadline)

    def _prune(self, now: float) -> None:
        """Forget nominations that ended (expired, taken over by a bind, forgotten or confirmed)."""
        entries = self.handle.ledger.entries
        for uid, deadline in list(self._active.items()):
            entry = entries.get(uid)
            if deadline <= now or entry is None or not entry.assumed or entry.deadline != deadline:
                del self._active[uid]

    # --- deciding the GPUs on one node (gpupool.scheduler.framework.choice) -----------------------------

    @staticmethod
    def _request(cycle: CycleState) -> PodRequest:
        assert cycle.request is not None
        return cycle.request

    @staticmethod
    def _mps(cycle: CycleState) -> bool:
        return cycle.parsed is not None and cycle.parsed.isolation == IsolationMode.MPS

    def _place(self, cycle: CycleState, node: str) -> Allocation | None:
        return gpus_on(self.handle.ledger.state, self.handle.context(), cycle, node)
