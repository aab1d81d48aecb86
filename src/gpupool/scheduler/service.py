"""The scheduler service: the pieces wired together, its lifecycle and its debug view.

Each piece has one home:
  gpupool.scheduler.watch       watch loops feeding the caches (ledger, pods, busy nodes, pending, workload)
  gpupool.scheduler.ledger      the allocation cache: assume / confirm (by the watch) / forget
  gpupool.scheduler.pods        the pod cache every decision reads its pod from
  gpupool.scheduler.framework   extension points, plugins and the binding cycle
  gpupool.scheduler.extender    the extender verbs as adapters over the framework
  gpupool.scheduler.app         the HTTP face

Filter and prioritize read only the caches (no API call unless a pod is not in the cache yet), so they stay
in the low milliseconds. Bind: assume (ledger) -> the node's bind slot (in memory, gpupool.scheduler.busy) ->
one write, the Binding carrying the pod annotation gpupool.io/allocation; see
gpupool.scheduler.framework.plugins for each step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gpupool.api.extender import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
)
from gpupool.api.recompute import recompute
from gpupool.cluster.port import RESOURCE_CLAIMS, ApiError, ClusterPort
from gpupool.scheduler.busy import BusyNodes
from gpupool.scheduler.claims import ClaimAllocator
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.defrag import Defragmenter
from gpupool.scheduler.extender import Extender
from gpupool.scheduler.framework.interface import Handle, StepHook
from gpupool.scheduler.framework.registry import build_profiles
from gpupool.scheduler.framework.runtime import Framework
from gpupool.scheduler.ledger import Ledger
from gpupool.scheduler.metrics import SchedulerMetrics
from gpupool.scheduler.moves import MakeRoom, MoveDeadlines
from gpupool.scheduler.pending import PendingPods
from gpupool.scheduler.pods import PodCache
from gpupool.scheduler.preempt_verb import preempt
from gpupool.scheduler.queue_status import QueueStatusWriter
from gpupool.scheduler.queue_status import register as register_queue_metrics
from gpupool.scheduler.queues import QueueCache
from gpupool.scheduler.watch import Watcher
from gpupool.scheduler.workload import ObservedWorkload

__all__ = ["ExtenderService", "StepHook"]


class ExtenderService:
    def __init__(
        self,
        cluster: ClusterPort,
        config: SchedulerConfig,
        metrics: SchedulerMetrics | None = None,
        clock: Callable[[], float] = time.time,
        step_hook: StepHook | None = None,
    ) -> None:
        self.cluster = cluster
        self.config = config
        self.metrics = metrics or SchedulerMetrics()
        self.clock = clock
        self.ledger = Ledger()
        self.pods = PodCache(cluster, lookup_timeout_s=config.pod_lookup_timeout_s)
        self.busy = BusyNodes(config.lock_timeout_s)
        self.workload = ObservedWorkload()
        # GPU pods that fit nowhere at their last filter: key -> (why, first seen); for the pool views.
        self.pending = PendingPods(clock, max_entries=config.max_pending_pods, ttl_s=config.pending_ttl_s)
        self.handle = Handle(cluster, config, self.ledger, self.pods, self.busy, self.pending, self.workload,
                             self.metrics, clock, step_hook)
        self.queues = self.handle.queues = QueueCache(cluster, self.ledger, config.default_queue)
        self.queue_status = QueueStatusWriter(cluster, self.queues, self.pending, lambda: self.ready, clock,
                                              config.queue_status_interval_s)
        register_queue_metrics(self.metrics.registry, self.queues, self.pending)
        pod_plugins, claim_plugins = build_profiles(self.handle)
        self.framework = Framework(self.handle, pod_plugins)
        # The claims of gated pods are scheduled by the same plugins (one instance each) under their profile.
        self.claim_framework = Framework(self.handle, claim_plugins)
        self.extender = Extender(self.handle, self.framework, lambda: self.ready)
        # gpupool's DRA claims (scheduler/claims.py), where this scheduler places them
        room = MakeRoom(self.handle, config.make_room_moves) if config.make_room_moves else None
        self.claims = ClaimAllocator(self.handle, lambda: self.ready, framework=self.claim_framework, room=room) \
            if config.dra_placement else None
        self.watcher = Watcher(self.handle, self.claims)
        # moves of remote shares past their deadline are cancelled (on the leader, once synced)
        self.deadlines = MoveDeadlines(self.handle, lambda: self.ready, config.move_check_s, config.move_deadline_s)
        # the background defragmenter (on the leader, once synced; off unless defrag_moves > 0)
        self.defrag = Defragmenter(self.handle, lambda: self.ready, config.defrag_moves, config.defrag_threshold,
                                   config.defrag_interval_s, config.defrag_gib, config.move_deadline_s)
        self.synced = False
        self.leading = not config.leader_elect
        self.metrics.track_ledger(
            lambda: len(self.ledger.assumed()),
            lambda: len(self.ledger.confirmed()),
            lambda: self.ledger.state.total_gpus,
        )
        self.metrics.ready.set_function(lambda: 1.0 if self.ready else 0.0)

    @property
    def step_hook(self) -> StepHook | None:
        return self.handle.step_hook

    @step_hook.setter
    def step_hook(self, hook: StepHook | None) -> None:
        self.handle.step_hook = hook

    # --- lifecycle ------------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.synced and self.leading

    async def start(self) -> None:
        """List nodes and pods into the caches, then follow their watch streams."""
        await self.watcher.start()
        await self.queues.start()
        self.queue_status.start()
        if self.claims is not None:
            self.claims.start()
        self.deadlines.start()
        self.defrag.start()
        self.synced = True

    async def stop(self) -> None:
        self.synced = False
        await self.defrag.stop()
        await self.deadlines.stop()
        if self.claims is not None:
            await self.claims.stop()
        await self.watcher.stop()
        await self.queue_status.stop()
        await self.queues.stop()

    async def resync(self) -> None:
        """Start over from a fresh list (a new leadership term must not trust an old cache)."""
        await self.stop()
        await self.start()

    # --- the extender verbs ---------------------------------------------------------------------------

    async def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        return await self.extender.filter(args)

    async def prioritize(self, args: ExtenderArgs) -> list[tuple[str, int]]:
        return await self.extender.prioritize(args)

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        return await self.extender.bind(args)

    async def preempt(self, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
        if not self.ready:
            return ExtenderPreemptionResult()
        return await preempt(self.handle, self.framework, args)

    # --- debug ----------------------------------------------------------------------------------------

    async def debug_ledger(self) -> dict[str, Any]:
        """The ledger against a recomputation from a fresh list of API objects (which also checks every
        allocation against its pod's spec and every GPU against its pod limit)."""
        nodes, _ = await self.cluster.list_nodes()
        pods, _ = await self.cluster.list_pods()
        try:
            claims, _ = await self.cluster.list_objects(RESOURCE_CLAIMS)
        except ApiError:  # no DRA here (the watch says so once): nothing of it can be in the ledger either
            claims = []
        truth = recompute(nodes, pods, claims, self.ledger.moves)
        workload = [
            {"cpu_milli": t.cpu_milli, "gpu_milli": t.gpu_milli, "gpu_count": t.gpu_count,
             "models": sorted(t.models), "weight": round(t.weight, 4)}
            for t in self.workload.current
        ]
        return {"ready": self.ready, "ledger": self.ledger.dump(), "diff": self.ledger.diff(truth),
                "workload": workload, "queues": self.queues.describe()}
