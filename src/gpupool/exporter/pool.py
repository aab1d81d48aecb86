"""Pool metrics: who holds which share of which GPU, cluster totals, and scheduling latency.

The collector reads a fresh snapshot at every scrape and keeps nothing between scrapes, so a pod that
is gone from the snapshot is gone from /metrics: the number of series is bounded by the live pool, not
by the history of pods (peers' per-pod gauges that are only ever `set` leak series of deleted pods).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.api.snapshot import Snapshot

log = logging.getLogger(__name__)

MIB = 1024 * 1024

GPU_LABELS = ("node", "gpu", "uuid")
GRANT_LABELS = ("namespace", "pod", "container", "node", "gpu", "uuid")

# name -> help. Every name here is produced by PoolCollector (the alert/dashboard tests rely on this).
POOL_METRICS: dict[str, str] = {
    "gpupool_snapshot_up": "1 if the last pool snapshot could be read, else 0.",
    "gpupool_gpu_info": "A GPU of the pool (value 1), with its model.",
    "gpupool_gpu_healthy": "1 if the GPU is healthy and may be allocated, else 0.",
    "gpupool_gpu_memory_bytes": "Memory of the GPU.",
    "gpupool_gpu_memory_allocated_bytes": "GPU memory handed out to pods.",
    "gpupool_gpu_cores_allocated_ratio": "Share of the GPU's compute handed out to pods (0-1).",
    "gpupool_gpu_sharers": "Number of pods holding a share of the GPU.",
    "gpupool_grant_memory_bytes": "GPU memory granted to one pod on one GPU.",
    "gpupool_grant_cores_ratio": "Share of one GPU's compute granted to one pod (0-1).",
    "gpupool_pool_nodes": "Nodes in the pool.",
    "gpupool_pool_gpus": "GPUs in the pool.",
    "gpupool_pool_healthy_gpus": "Healthy GPUs in the pool.",
    "gpupool_pool_allocated_ratio": "Share of the pool's GPU compute handed out (0-1).",
    "gpupool_pool_memory_allocated_ratio": "Share of the pool's GPU memory handed out (0-1).",
    "gpupool_pool_fragmented_ratio": "Share of the pool's GPU compute that is free but unusable by the "
    "expected workload (FGD-style, 0-1).",
    "gpupool_pool_gpu_pods": "Pods holding at least one GPU share.",
    "gpupool_pending_gpu_pods": "GPU pods waiting for a placement.",
    "gpupool_pending_gpu_pod_oldest_seconds": "How long the longest-waiting GPU pod has waited "
    "(absent when the scheduler does not know).",
}
SCRAPE_ERRORS = "gpupool_snapshot_errors"  # counter, exposed as gpupool_snapshot_errors_total
LATENCY = "gpupool_scheduling_latency_seconds"  # histogram


class PoolCollector(Collector):
    """A prometheus_client collector over a snapshot provider (called once per scrape)."""

    def __init__(self, provider: Callable[[], Snapshot], registry: CollectorRegistry | None = None) -> None:
        self._provider = provider
        self._errors = 0  # kept across scrapes, so failures stay visible after the provider recovers
        if registry is not None:
            registry.register(self)

    def describe(self) -> list[Metric]:
        # Returning families lets the registry check for name clashes without calling the provider.
        gauges = [GaugeMetricFamily(name, help_, labels=()) for name, help_ in POOL_METRICS.items()]
        return [self._errors_family(), *gauges]

    def _errors_family(self) -> CounterMetricFamily:
        return CounterMetricFamily(SCRAPE_ERRORS, "Scrapes for which the pool snapshot could not be read.",
                                   value=self._errors)

    def collect(self) -> Iterator[Metric]:
        try:
            snap = self._provider()
        except Exception:
            # A broken provider must not break /metrics: report it and keep serving.
            log.exception("pool snapshot provider failed")
            self._errors += 1
            yield self._errors_family()
            yield GaugeMetricFamily("gpupool_snapshot_up", POOL_METRICS["gpupool_snapshot_up"], value=0)
            return
        yield self._errors_family()
        yield GaugeMetricFamily("gpupool_snapshot_up", POOL_METRICS["gpupool_snapshot_up"], value=1)
        yield from snapshot_families(snap)


def _family(name: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, POOL_METRICS[name], labels=labels)


def snapshot_families(snap: Snapshot) -> list[GaugeMetricFamily]:
    """The gauge families for one snapshot (everything but `gpupool_snapshot_up`)."""
    info = _family("gpupool_gpu_info", (*GPU_LABELS, "model"))
    healthy = _family("gpupool_gpu_healthy", GPU_LABELS)
    memory = _family("gpupool_gpu_memory_bytes", GPU_LABELS)
    mem_alloc = _family("gpupool_gpu_memory_allocated_bytes", GPU_LABELS)
    cores = _family("gpupool_gpu_cores_allocated_ratio", GPU_LABELS)
    sharers = _family("gpupool_gpu_sharers", GPU_LABELS)
    grant_mem = _family("gpupool_grant_memory_bytes", GRANT_LABELS)
    grant_cores = _family("gpupool_grant_cores_ratio", GRANT_LABELS)
    for node in snap.nodes:
        for gpu in node.gpus:
            lv = [node.name, str(gpu.index), gpu.uuid]
            info.add_metric([*lv, gpu.model], 1)
            healthy.add_metric(lv, 1 if gpu.healthy else 0)
            memory.add_metric(lv, gpu.memory_mib * MIB)
            mem_alloc.add_metric(lv, gpu.allocated_memory_mib * MIB)
            cores.add_metric(lv, gpu.allocated_cores_percent / 100)
            sharers.add_metric(lv, gpu.sharers)
            for g in gpu.grants:
                glv = [g.namespace, g.pod, g.container, g.node, str(g.gpu_index), g.gpu_uuid]
                grant_mem.add_metric(glv, g.memory_mib * MIB)
                grant_cores.add_metric(glv, g.cores_percent / 100)
    t = snap.totals
    families = [info, healthy, memory, mem_alloc, cores, sharers, grant_mem, grant_cores]
    scalars = {
        "gpupool_pool_nodes": t.nodes,
        "gpupool_pool_gpus": t.gpus,
        "gpupool_pool_healthy_gpus": t.healthy_gpus,
        "gpupool_pool_allocated_ratio": t.allocated_share,
        "gpupool_pool_memory_allocated_ratio": t.allocated_memory_share,
        "gpupool_pool_fragmented_ratio": t.fragmented_share,
        "gpupool_pool_gpu_pods": t.gpu_pods,
        "gpupool_pending_gpu_pods": t.pending,
    }
    if t.oldest_pending_seconds is not None:
        scalars["gpupool_pending_gpu_pod_oldest_seconds"] = t.oldest_pending_seconds
    for name, value in scalars.items():
        families.append(GaugeMetricFamily(name, POOL_METRICS[name], value=value))
    return families


# Extender verbs answer in well under a second; binds wait on the API server, hence the long tail.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class SchedulingLatency:
    """Histogram of scheduler decision latency per extender verb (filter, prioritize, bind, ...)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.histogram = Histogram(
            LATENCY, "Time the scheduler took to answer one extender call.", labelnames=("verb",),
            buckets=LATENCY_BUCKETS, registry=registry,
        )

    def observe(self, verb: str, seconds: float) -> None:
        self.histogram.labels(verb=verb).observe(seconds)

    @contextmanager
    def time(self, verb: str) -> Iterator[None]:
        """`with latency.time("filter"): ...` observes the block's duration (also when it raises)."""
        with self.histogram.labels(verb=verb).time():
            yield
