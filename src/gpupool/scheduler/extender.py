"""kube-scheduler's extender verbs as thin adapters over the framework.

A request body only names its pod (namespace, name, UID: `PodRef`); the pod itself comes from the
scheduler's cache (gpupool.scheduler.pods), so a forged copy with other limits, another scheduler name or
another phase changes nothing. A request that names no real pod of gpupool's is refused with the reason:
on every offered node in `FailedAndUnresolvableNodes` (filter), no scores (prioritize), or the bind's
`Error`. Nothing is nominated, noted as pending, learned or written for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from gpupool.api.extender import (
    MAX_EXTENDER_PRIORITY,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    NodeList,
)
from gpupool.api.preferences import soft_preferences
from gpupool.cluster.port import ApiError, Obj
from gpupool.scheduler.framework.cycle import CycleState, NodeSet, Offered, Phase
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.runtime import Framework
from gpupool.scheduler.framework.status import Code, Status, error, unresolvable
from gpupool.scheduler.pods import PodRef, PodRefused

log = logging.getLogger(__name__)

NOT_READY = "gpupool scheduler not ready (cache not synced or not the leader)"


class Extender:
    def __init__(self, handle: Handle, framework: Framework, ready: Callable[[], bool]) -> None:
        self.h = handle
        self.fw = framework
        self._ready = ready  # the service: caches synced and leading

    async def _start(self, ref: PodRef, phase: Phase) -> CycleState | Status:
        """A cycle for the pod `ref` names, after PreFilter; or why there is none."""
        if not self._ready():
            return error(NOT_READY)
        self.h.ledger.refresh()  # node events already seen count, even before the watch's own refresh
        try:
            pod = await self.h.pods.resolve(ref)
        except PodRefused as e:
            self.h.metrics.refused.labels(phase.value).inc()
            return error(str(e)) if e.retry else unresolvable(str(e))
        cycle = self.fw.cycle(pod, phase)
        status = self.fw.pre_filter(cycle)
        if not status.ok:
            if status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
                self.h.metrics.refused.labels(phase.value).inc()
            return status
        return cycle

    # --- /filter --------------------------------------------------------------------------------------

    async def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        names = args.node_names()
        cycle = await self._start(PodRef.of(args.Pod), Phase.FILTER)
        if isinstance(cycle, Status):
            if cycle.code == Code.ERROR:
                return ExtenderFilterResult(NodeNames=[] if args.Nodes is None else None, Error=cycle.reason)
            return self._filter_result(args, [], {}, dict.fromkeys(names, cycle.reason))
        # kube-scheduler reads the rejected nodes' reasons only when no node is left (its FitError, and
        # preemption): they are written only then, which spares thousands of them per call on large clusters.
        nodes = self.fw.filter(cycle, names, reasons=False)
        if not len(nodes):
            nodes = self.fw.filter(cycle, names)
        if cycle.wants_gpu:
            if not len(nodes):
                self.fw.post_filter(cycle, nodes)
            else:
                self.h.pending.discard(cycle.key)
                if len(nodes) == 1:
                    # kube-scheduler skips prioritize when one node is left: reserve it here instead.
                    self.fw.reserve(cycle, nodes.alive_names()[0])
                elif self.h.config.decide_in_filter and not soft_preferences(cycle.pod):
                    # The pick, reserved as prioritize would: kube-scheduler, left one node, scores nothing
                    # and skips prioritize.
                    return self._filter_result(args, [self._pick(cycle, nodes)[2]], {}, {})
        return self._filter_result(args, nodes.alive_names(), nodes.failed, nodes.unresolvable)

    @staticmethod
    def _filter_result(
        args: ExtenderArgs, feasible: list[str], failed: dict[str, str], unresolvable: dict[str, str]
    ) -> ExtenderFilterResult:
        if args.Nodes is not None and args.NodeNames is None:
            keep = set(feasible)
            items = [n for n in args.Nodes.items if (n.get("metadata") or {}).get("name") in keep]
            return ExtenderFilterResult(
                Nodes=NodeList(items=items), FailedNodes=failed, FailedAndUnresolvableNodes=unresolvable
            )
        # Built from our own values: no need to validate thousands of names again.
        return ExtenderFilterResult.model_construct(
            Nodes=None, NodeNames=feasible, FailedNodes=failed, FailedAndUnresolvableNodes=unresolvable, Error=""
        )

    # --- /prioritize ----------------------------------------------------------------------------------

    async def prioritize(self, args: ExtenderArgs) -> list[tuple[str, int]]:
        """Scores 0..10: the winner (the policy's pick and tie-break, steered off busy nodes) gets 10, the
        others their score scaled to 0..9 (so kube-scheduler, summing weighted scores, follows the policy).
        Nodes scoring 0 are left out: kube-scheduler adds nothing for a host the extender does not list,
        and the answer stays small on large clusters. Returns (host, score) pairs."""
        cycle = await self._start(PodRef.of(args.Pod), Phase.PRIORITIZE)
        if isinstance(cycle, Status) or not cycle.wants_gpu:
            return []
        nodes: NodeSet = self.fw.filter(cycle, args.node_names(), reasons=False)  # the answer has no reasons
        if not len(nodes):
            return []
        s, offered, chosen = self._pick(cycle, nodes)
        lo, hi = float(s.min()), float(s.max())
        scaled = np.floor((s - lo) / (hi - lo) * (MAX_EXTENDER_PRIORITY - 1)) if hi > lo else np.zeros(len(s))
        keep = np.flatnonzero(scaled > 0)
        scores = dict(zip(offered.names[keep].tolist(), scaled[keep].astype(np.int64).tolist(), strict=True))
        scores[chosen] = MAX_EXTENDER_PRIORITY
        return list(scores.items())

    def _pick(self, cycle: CycleState, nodes: NodeSet) -> tuple[np.ndarray, Offered, str]:
        """The Score plugins over the feasible `nodes`: their scores, the nodes as scored, and the winner,
        reserved for the pod."""
        s, offered, chosen = self.fw.select(cycle, nodes)
        self.fw.reserve(cycle, chosen)
        return s, offered, chosen

    # --- /bind ----------------------------------------------------------------------------------------

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        h = self.h
        ref = PodRef(args.PodNamespace, args.PodName, args.PodUID)
        # While a bind runs (even one kube-scheduler gave up waiting for), a new scheduling cycle of the
        # same pod must not drop the reservation that bind is writing.
        h.binding[args.PodUID] = h.binding.get(args.PodUID, 0) + 1
        cycle: CycleState | Status | None = None
        try:
            cycle = await self._start(ref, Phase.BIND)
            status = cycle if isinstance(cycle, Status) else await self.fw.bind_pod(cycle, args.Node)
        except ApiError as e:
            h.busy.forget_nomination(args.PodUID)
            h.metrics.binds.labels("error").inc()
            return ExtenderBindingResult(Error=f"API error while binding: {e}")
        finally:
            left = h.binding.pop(args.PodUID) - 1
            if left:
                h.binding[args.PodUID] = left
        if not status.ok:
            h.busy.forget_nomination(args.PodUID)  # its node is no longer waiting for this pod
            h.metrics.binds.labels("failed").inc()
            if isinstance(cycle, CycleState):  # events only for pods that exist (never for a caller's names)
                await self._event(cycle.pod, "FailedBinding", status.reason, "Warning")
            return ExtenderBindingResult(Error=status.reason or "bind refused")
        h.metrics.binds.labels("bound").inc()
        return ExtenderBindingResult()

    async def _event(self, pod: Obj, reason: str, message: str, type_: str) -> None:
        meta = pod.get("metadata") or {}
        await self.h.record_event(meta.get("namespace") or "default", str(meta.get("name")), str(meta.get("uid")),
                                  reason, message[:1024], type_)
