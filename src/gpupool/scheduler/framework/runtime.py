"""The framework: runs a profile's plugins at each extension point, and the binding cycle.

A cycle always starts from the pod as the scheduler's cache (or the API server) shows it. The extender
verbs map onto the extension points (gpupool.scheduler.extender):

  /filter      PreFilter, Filter, then Reserve when exactly one node is left (kube-scheduler then skips
               prioritize), PostFilter when none is
  /prioritize  PreFilter, Filter, Score, Reserve of the winner
  /bind        PreFilter, then `bind_pod`: a replay already done answers at once; otherwise, one bind per
               node at a time: Filter on the node unless the pod holds a reservation there, Reserve,
               Permit, Bind; any failure after Reserve runs Unreserve (reverse order)

A DRA claim of a gated pod (gpupool.scheduler.claims) is one `place` under the claim profile: PreFilter,
Filter, PostFilter when no node is left, else Score and Reserve of the winner, as a pod's filter and
prioritize calls; the claim allocator then writes the allocation (kube-scheduler binds the pod).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol, runtime_checkable

import numpy as np

from gpupool.api.logsafe import shown
from gpupool.api.pod import pod_key
from gpupool.cluster.port import Obj
from gpupool.core.fit import Fit
from gpupool.core.placement import Scored, best
from gpupool.core.state import IntArray
from gpupool.scheduler.framework.cycle import CycleState, NameIndex, NodeSet, Offered, Phase
from gpupool.scheduler.framework.interface import (
    BindPlugin,
    FilterPlugin,
    Handle,
    PermitPlugin,
    Plugin,
    PostFilterPlugin,
    PreFilterPlugin,
    ReservePlugin,
    ScorePlugin,
    UnreservePlugin,
)
from gpupool.scheduler.framework.status import SUCCESS, Code, Status, unschedulable
from gpupool.scheduler.pods import PodRef, PodRefused

log = logging.getLogger(__name__)


@runtime_checkable
class ReplayCheck(Protocol):
    """A Bind plugin that can tell a replayed bind that already took effect (see plugins.binding)."""

    def done(self, cycle: CycleState, node: str) -> Status | None: ...


class Framework:
    def __init__(self, handle: Handle, plugins: list[Plugin]) -> None:
        self.handle = handle
        self.plugins = plugins
        self.pre_filters = [p for p in plugins if isinstance(p, PreFilterPlugin)]
        self.filters = [p for p in plugins if isinstance(p, FilterPlugin)]
        self.post_filters = [p for p in plugins if isinstance(p, PostFilterPlugin)]
        self.scores = [p for p in plugins if isinstance(p, ScorePlugin)]
        self.reserves = [p for p in plugins if isinstance(p, ReservePlugin)]
        self.unreserves = [p for p in reversed(plugins) if isinstance(p, UnreservePlugin)]
        self.permits = [p for p in plugins if isinstance(p, PermitPlugin)]
        self.binds = [p for p in plugins if isinstance(p, BindPlugin)]
        # Sorted out once: isinstance against a runtime Protocol walks its attributes (0.1-0.2 ms per call).
        self.replay_checks = [p for p in self.binds if isinstance(p, ReplayCheck)]
        self._node_mutex: dict[str, asyncio.Lock] = {}
        self._names = NameIndex()

    def plugin(self, name: str) -> Plugin:
        return next(p for p in self.plugins if p.name == name)

    def cycle(self, pod: Obj, phase: Phase) -> CycleState:
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        return CycleState(pod=pod, phase=phase, uid=uid, key=pod_key(pod), now=self.handle.clock())

    @staticmethod
    def _runs(plugin: Plugin, cycle: CycleState) -> bool:
        return cycle.wants_gpu or not plugin.gpu_only

    # --- scheduling cycle -----------------------------------------------------------------------------

    def pre_filter(self, cycle: CycleState) -> Status:
        for p in self.pre_filters:
            if not self._runs(p, cycle):
                continue
            status = p.pre_filter(cycle)
            if status.code == Code.SKIP or status.ok:
                continue
            return status.by(p.name)
        return SUCCESS

    def filter(self, cycle: CycleState, names: list[str], reasons: bool = True) -> NodeSet:
        """The Filter plugins over `names`; `reasons` False when nobody reads why a node was rejected."""
        nodes = NodeSet(names, self._names.lookup(names, self.handle.ledger.state.index), reasons)
        for p in self.filters:
            if not len(nodes):
                break
            if self._runs(p, cycle):
                p.filter(cycle, nodes)
        return nodes

    def post_filter(self, cycle: CycleState, nodes: NodeSet) -> Status:
        for p in self.post_filters:
            if self._runs(p, cycle):
                status = p.post_filter(cycle, nodes)
                if not status.ok:
                    return status.by(p.name)
        return SUCCESS

    def score(self, cycle: CycleState, nodes: IntArray) -> tuple[np.ndarray, int]:
        """Summed scores of `nodes` (each plugin's values as they are) and the position of the winner:
        the highest score among the nodes no plugin asked to avoid (all of them if every node is to be
        avoided), ties to the lowest node rank as the policies break them (gpupool.core.placement.best)."""
        total = np.zeros(len(nodes))
        avoid = np.zeros(len(nodes), dtype=bool)
        for p in self.scores:
            if not self._runs(p, cycle):
                continue
            answer = p.score(cycle, nodes)
            if answer.values is not None:
                total = total + answer.values
            if answer.avoid is not None:
                avoid |= answer.avoid
        steered = np.where(avoid, -np.inf, total) if avoid.any() and not avoid.all() else total
        placeholder = Fit(nodes, np.zeros(len(nodes), dtype=np.int64), np.zeros((len(nodes), 1), dtype=bool))
        return total, best(Scored(placeholder, nodes, steered), self.handle.context())

    def select(self, cycle: CycleState, nodes: NodeSet) -> tuple[np.ndarray, Offered, str]:
        """The Score plugins over the feasible `nodes`: their scores, the nodes as scored, and the winner."""
        offered = nodes.alive_offered()
        s, winner = self.score(cycle, offered.index)
        return s, offered, str(offered.names[winner])

    async def place(self, cycle: CycleState, names: list[str]) -> tuple[Status, str | None]:
        """A whole scheduling cycle here, for a pod no extender call serves (a gated pod's DRA claim):
        PreFilter, Filter over `names`, PostFilter when none is left (why, with one node's reason as the
        example, as the pending note says it), else Score and Reserve of the winner. Returns the status and
        the node reserved (None unless SUCCESS); a failed Reserve is undone (Unreserve)."""
        status = self.pre_filter(cycle)
        if not status.ok:
            return status, None
        nodes = self.filter(cycle, names)
        if not len(nodes):
            self.post_filter(cycle, nodes)
            example = nodes.example()
            return unschedulable(f"fits no node, e.g. {example}" if example else "no node offered"), None
        _, _, chosen = self.select(cycle, nodes)
        status = self.reserve(cycle, chosen)
        if not status.ok:
            await self.unreserve(cycle, chosen)
            return status, None
        return SUCCESS, chosen

    def reserve(self, cycle: CycleState, node: str) -> Status:
        for p in self.reserves:
            if self._runs(p, cycle):
                status = p.reserve(cycle, node)
                if not status.ok:
                    return status.by(p.name)
        return SUCCESS

    def reserved(self, cycle: CycleState, node: str) -> bool:
        return any(p.reserved(cycle, node) for p in self.reserves if self._runs(p, cycle))

    async def unreserve(self, cycle: CycleState, node: str) -> None:
        for p in self.unreserves:
            if self._runs(p, cycle):
                try:
                    await p.unreserve(cycle, node)
                except Exception as e:  # undoing is best effort; the deadlines clean up the rest
                    log.warning("unreserve %s of %s on %s failed: %s", p.name, cycle.key, node, e)

    # --- binding cycle --------------------------------------------------------------------------------

    async def permit(self, cycle: CycleState, node: str) -> Status:
        loop = asyncio.get_running_loop()
        for p in self.permits:
            if not self._runs(p, cycle):
                continue
            deadline = loop.time() + p.max_wait_s  # a duration: monotonic, not the wall clock
            while True:
                status = await p.permit(cycle, node)
                if status.code != Code.WAIT:
                    if not status.ok:
                        return status.by(p.name)
                    break
                if status.wake is None and status.retry_after_s <= 0:
                    continue  # the plugin asks to be asked again at once (it reads afresh)
                if loop.time() >= deadline:
                    return unschedulable(status.reason).by(p.name)
                if status.wake is not None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(status.wake.wait(), timeout=status.retry_after_s or None)
                else:
                    await asyncio.sleep(status.retry_after_s)
        return SUCCESS

    async def bind(self, cycle: CycleState, node: str) -> Status:
        for p in self.binds:
            if self._runs(p, cycle):
                status = await p.bind(cycle, node)
                if status.code != Code.SKIP:
                    return status.by(p.name)
        return unschedulable("no bind plugin took the pod")

    def replayed(self, cycle: CycleState, node: str) -> Status | None:
        for p in self.replay_checks:
            if self._runs(p, cycle):
                done = p.done(cycle, node)
                if done is not None:
                    return done.by(p.name)
        return None

    async def bind_pod(self, cycle: CycleState, node: str) -> Status:
        """The binding cycle for a pod that passed PreFilter. Exceptions (API errors) propagate after
        Unreserve; a BaseException (a crash, in tests) skips it, as a killed process would."""
        done = self.replayed(cycle, node)
        if done is not None:
            return done
        if node not in self.handle.ledger.node_objs:
            nodes = self.filter(cycle, [node])  # says why, with the Filter plugins' words
            return self._refusal(cycle, nodes, node)
        if not cycle.wants_gpu:
            nodes = self.filter(cycle, [node])
            if not len(nodes):
                return self._refusal(cycle, nodes, node)
            return await self.bind(cycle, node)
        mutex = self._node_mutex.setdefault(node, asyncio.Lock())
        waited = mutex.locked()
        async with mutex:  # our own binds to one node go one at a time (one pod per node awaits Allocate)
            if waited:
                # Another bind (perhaps this very one, replayed) went first: decide on a fresh read.
                try:
                    namespace, name = cycle.key.split("/", 1)
                    cycle.pod = await self.handle.pods.fetch(PodRef(namespace, name, cycle.uid))
                except PodRefused as e:
                    return unschedulable(str(e))
                done = self.replayed(cycle, node)
                if done is not None:
                    return done
            return await self._reserve_permit_bind(cycle, node)

    async def _reserve_permit_bind(self, cycle: CycleState, node: str) -> Status:
        h = self.handle
        if not self.reserved(cycle, node):
            nodes = self.filter(cycle, [node])
            if not len(nodes):
                return self._refusal(cycle, nodes, node)
        status = self.reserve(cycle, node)
        if not status.ok:
            await self.unreserve(cycle, node)
            return status
        try:
            await h.step("assumed")
            status = await self.permit(cycle, node)
            if status.ok:
                await h.step("locked")
                status = await self.bind(cycle, node)
            if status.ok:
                await h.step("bound")
        except Exception:
            await self.unreserve(cycle, node)
            raise
        if not status.ok:
            await self.unreserve(cycle, node)
        return status

    @staticmethod
    def _refusal(cycle: CycleState, nodes: NodeSet, node: str) -> Status:
        if node in nodes.unresolvable:
            return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
                          f"cannot bind {cycle.key} to {shown(node, 64)}: {nodes.unresolvable[node]}")
        return unschedulable(f"pod {cycle.key} does not fit on {shown(node, 64)}: {nodes.failed.get(node, 'rejected')}")
