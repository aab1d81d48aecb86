"""What each team queue holds, for people: the GPUQueue objects' status (written by the leading scheduler)
and per-queue Prometheus gauges (read at scrape time). Usage is the ledger's (bound and in-flight
allocations), pending pods are those the scheduler last found no room for.

Status (`status` of the GPUQueue, amounts as in the spec: gpus, gpuMemory in MiB, gpuCores in percent):
  {"usage": {...}, "borrowed": {...}, "lent": {...}, "pendingPods": 3, "updated": "<time>"}
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpupool.api.times import format_time
from gpupool.cluster.port import ApiError, ClusterPort
from gpupool.core.model import MILLI_PER_GPU
from gpupool.core.queues import UNLIMITED, QueueStatus, Quota, statuses
from gpupool.scheduler.beat import Beat
from gpupool.scheduler.queues import GPUQUEUES, QueueCache, namespace_of
from gpupool.scheduler.squeeze import DEFAULT_HOLD_S, lift_squeezes

log = logging.getLogger(__name__)


def amounts(q: Quota) -> dict[str, Any]:
    return {"gpus": f"{q.gpu_milli / MILLI_PER_GPU:g}", "gpuMemory": f"{q.memory_mib}Mi", "gpuCores": q.cores}


def current(cache: QueueCache, pending: Mapping[str, Any]) -> list[QueueStatus]:
    waiting: dict[str, int] = {}
    for key in pending:
        queue = cache.queue_of(namespace_of(key))
        waiting[queue] = waiting.get(queue, 0) + 1
    return statuses(cache.queues.tree, cache.usage(), waiting)


class QueueStatusWriter:
    """Patches each GPUQueue's status when it changed, every `interval_s`, while `active()` (the leader); on
    the same beat, lifts the compute squeezes whose borrowers no longer need to give way
    (gpupool.scheduler.squeeze.lift_squeezes)."""

    def __init__(self, cluster: ClusterPort, cache: QueueCache, pending: Mapping[str, Any],
                 active: Callable[[], bool], clock: Callable[[], float], interval_s: float = 5.0,
                 squeeze_hold_s: float = DEFAULT_HOLD_S) -> None:
        self.cluster, self.cache, self.pending = cluster, cache, pending
        self.active, self.clock, self.interval_s = active, clock, interval_s
        self.squeeze_hold_s = squeeze_hold_s
        self._written: dict[str, dict[str, Any]] = {}
        self._beat = Beat("queue-status", interval_s, lambda: self.active() and self.cache.enabled, self._once, (),
                          "queue statuses not written")

    def start(self) -> None:
        self._beat.start()

    async def stop(self) -> None:
        await self._beat.stop()

    async def _once(self) -> None:
        await self.write_once()
        try:
            await lift_squeezes(self.cluster, self.cache, self.pending, self.clock(), self.squeeze_hold_s)
        except Exception:  # the next beat tries again; status writing must go on
            log.exception("lifting compute squeezes failed")

    async def write_once(self) -> int:
        """Write the statuses that changed; returns how many were written."""
        written = 0
        names = {str(o["metadata"]["name"]) for o in self.cache.objects()}
        for s in current(self.cache, self.pending):
            if s.name not in names:
                continue  # the default queue nobody created has no object to write to
            body = {"usage": amounts(s.usage), "borrowed": amounts(s.borrowed), "lent": amounts(s.lent),
                    "pendingPods": s.pending}
            if self._written.get(s.name) == body:
                continue
            try:
                await self.cluster.patch_object(GPUQUEUES, s.name, {"status": {**body, "updated": format_time(
                    self.clock())}}, subresource="status")
            except ApiError as e:
                log.warning("GPUQueue %s: status not written: %s", s.name, e)
                continue
            self._written[s.name] = body
            written += 1
        return written


class QueueCollector(Collector):
    """Per-queue gauges, computed at scrape time from the cache and the ledger."""

    def __init__(self, cache: QueueCache, pending: Mapping[str, Any]) -> None:
        self.cache, self.pending = cache, pending

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {
            "usage": GaugeMetricFamily("gpupool_queue_usage", "What a queue's pods hold", labels=["queue", "resource"]),
            "guaranteed": GaugeMetricFamily("gpupool_queue_guaranteed", "A queue's guarantee",
                                            labels=["queue", "resource"]),
            "maximum": GaugeMetricFamily("gpupool_queue_maximum", "A queue's maximum (absent: unlimited)",
                                         labels=["queue", "resource"]),
            "borrowed": GaugeMetricFamily("gpupool_queue_borrowed", "Usage beyond the guarantee",
                                          labels=["queue", "resource"]),
            "lent": GaugeMetricFamily("gpupool_queue_lent", "Guarantee idle and lent to others",
                                      labels=["queue", "resource"]),
        }
        pending = GaugeMetricFamily("gpupool_queue_pending_pods", "GPU pods of a queue waiting for room",
                                    labels=["queue"])
        if self.cache.enabled:
            for s in current(self.cache, self.pending):
                for what, q in (("usage", s.usage), ("guaranteed", s.guaranteed), ("maximum", s.maximum),
                                ("borrowed", s.borrowed), ("lent", s.lent)):
                    for resource, value in (("gpus", q.gpu_milli / MILLI_PER_GPU), ("gpu_memory_bytes",
                                            q.memory_mib * 1048576), ("gpu_cores_percent", q.cores)):
                        raw = {"gpus": q.gpu_milli, "gpu_memory_bytes": q.memory_mib,
                               "gpu_cores_percent": q.cores}[resource]
                        if raw < UNLIMITED // 2:
                            families[what].add_metric([s.name, resource], float(value))
                pending.add_metric([s.name], float(s.pending))
        yield from families.values()
        yield pending


def register(registry: CollectorRegistry, cache: QueueCache, pending: Mapping[str, Any]) -> None:
    registry.register(QueueCollector(cache, pending))
