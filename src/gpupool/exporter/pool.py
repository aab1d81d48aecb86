"""Pool metrics: who holds which share of which GPU, cluster totals, and scheduling latency.

The collector reads a fresh snapshot at every scrape and keeps nothing between scrapes, so a pod that
is gone from the snapshot is gone from /metrics: the number of series is bounded by the live pool, not
by the history of pods (per-pod gauges that are only ever `set` would keep the series of deleted pods).

Vendors: every per-GPU series carries `vendor` (nvidia / amd / ascend) and `model`. Both are fixed by the
card (its UUID), so they add no series, only a way to aggregate: `sum by (vendor) (...)`. Per vendor, the
`gpupool_vendor_*` series give each vendor's cards, memory and allocated shares (a handful of series); per
hardware partition (MIG instance, AMD partition, Ascend vNPU), `gpupool_gpu_partition_used` says whether a
pod holds it: at most 15 per card (a 30-core Ascend 910B's vNPUs), and none on cards that are not partitioned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.api.snapshot import Snapshot

log = logging.getLogger(__name__)

MIB = 1024 * 1024

GPU_LABELS = ("node", "gpu", "uuid", "vendor", "model")
VENDOR_LABELS = ("vendor", "runtime")
PARTITION_LABELS = (*GPU_LABELS, "profile", "start")
GRANT_LABELS = ("namespace", "pod", "container", "node", "gpu", "uuid")

# name -> help. Every name here is produced by PoolCollector (the alert/dashboard tests rely on this).
POOL_METRICS: dict[str, str] = {
    "gpupool_snapshot_up": "1 if the last pool snapshot could be read, else 0.",
    "gpupool_gpu_info": "A GPU of the pool (value 1), with its vendor, model and the runtime it serves.",
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
    "gpupool_vendor_gpus": "GPUs of one vendor in the pool.",
    "gpupool_vendor_healthy_gpus": "Healthy GPUs of one vendor.",
    "gpupool_vendor_memory_bytes": "Memory of one vendor's GPUs.",
    "gpupool_vendor_allocated_ratio": "Share of one vendor's GPU compute handed out (0-1).",
    "gpupool_vendor_memory_allocated_ratio": "Share of one vendor's GPU memory handed out (0-1).",
}
# Produced only where a card is partitioned (kept apart: a pool of whole cards has none of these series).
PARTITION_METRICS: dict[str, str] = {
    "gpupool_gpu_partition_used": "A hardware partition of a GPU (MIG instance, AMD partition, Ascend vNPU): "
    "1 if a pod holds it, 0 if idle.",
}
HELP: dict[str, str] = {**POOL_METRICS, **PARTITION_METRICS}
SCRAPE_ERRORS = "gpupool_snapshot_errors"  # counter, exposed as gpupool_snapshot_errors_total


@dataclass(frozen=True, slots=True)
class PoolFrame:
    """One scrape's pool data: the snapshot (None when the provider failed) and the failures so far.

    Taking a frame calls the provider; rendering it touches only the immutable snapshot, so a service can
    take the frame where its state is consistent (its event loop) and render it in a worker thread."""

    snapshot: Snapshot | None
    errors: int

    def small_families(self) -> list[Metric]:
        """Errors, up, and the unlabelled pool totals."""
        errors = CounterMetricFamily(SCRAPE_ERRORS, "Scrapes for which the pool snapshot could not be read.",
                                     value=self.errors)
        up = GaugeMetricFamily("gpupool_snapshot_up", POOL_METRICS["gpupool_snapshot_up"],
                               value=0 if self.snapshot is None else 1)
        if self.snapshot is None:
            return [errors, up]
        return [errors, up, *(GaugeMetricFamily(n, POOL_METRICS[n], value=v) for n, v in _scalars(self.snapshot))]

    def labelled_families(self) -> list[GaugeMetricFamily]:
        """The per-GPU and per-grant gauges as prometheus_client families."""
        families = {name: GaugeMetricFamily(name, HELP[name], labels=labels) for name, labels in LABELLED}
        if self.snapshot is not None:
            for name, labels, value in _labelled_samples(self.snapshot):
                families[name].add_metric(labels, value)
        return list(families.values())

    def labelled_text(self) -> str:
        """The same gauges in the text exposition format (also valid OpenMetrics for gauges), written
        directly: at 100,000 series this is several times faster than the generic encoder."""
        lines: dict[str, list[str]] = {name: [] for name, _ in LABELLED}
        label_names = dict(LABELLED)
        if self.snapshot is not None:
            for name, labels, value in _labelled_samples(self.snapshot):
                pairs = ",".join(f'{k}="{_escape(v)}"' for k, v in zip(label_names[name], labels, strict=True))
                lines[name].append(f"{name}{{{pairs}}} {float(value)!r}")
        out = []
        for name, samples in lines.items():
            out.append(f"# HELP {name} {HELP[name]}\n# TYPE {name} gauge\n")
            if samples:
                out.append("\n".join(samples))
                out.append("\n")
        return "".join(out)


class PoolCollector(Collector):
    """A prometheus_client collector over a snapshot provider (called once per scrape).

    Register it in a registry for the generic path, or give it to `metrics_route(registry, pool=...)`
    (not registered) for the fast path that also calls the provider on the event loop."""

    def __init__(self, provider: Callable[[], Snapshot], registry: CollectorRegistry | None = None) -> None:
        self._provider = provider
        self._errors = 0  # kept across scrapes, so failures stay visible after the provider recovers
        if registry is not None:
            registry.register(self)

    def describe(self) -> list[Metric]:
        # Returning families lets the registry check for name clashes without calling the provider.
        return [
            CounterMetricFamily(SCRAPE_ERRORS, "", value=0),
            *(GaugeMetricFamily(name, help_, labels=()) for name, help_ in HELP.items()),
        ]

    def take(self) -> PoolFrame:
        try:
            snap = self._provider()
        except Exception:
            # A broken provider must not break /metrics: report it and keep serving.
            log.exception("pool snapshot provider failed")
            self._errors += 1
            return PoolFrame(None, self._errors)
        return PoolFrame(snap, self._errors)

    def collect(self) -> Iterator[Metric]:
        frame = self.take()
        yield from frame.small_families()
        if frame.snapshot is not None:
            yield from frame.labelled_families()


LABELLED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gpupool_gpu_info", (*GPU_LABELS, "runtime")),
    ("gpupool_gpu_healthy", GPU_LABELS),
    ("gpupool_gpu_memory_bytes", GPU_LABELS),
    ("gpupool_gpu_memory_allocated_bytes", GPU_LABELS),
    ("gpupool_gpu_cores_allocated_ratio", GPU_LABELS),
    ("gpupool_gpu_sharers", GPU_LABELS),
    ("gpupool_grant_memory_bytes", GRANT_LABELS),
    ("gpupool_grant_cores_ratio", GRANT_LABELS),
    ("gpupool_gpu_partition_used", PARTITION_LABELS),
    ("gpupool_vendor_gpus", VENDOR_LABELS),
    ("gpupool_vendor_healthy_gpus", VENDOR_LABELS),
    ("gpupool_vendor_memory_bytes", VENDOR_LABELS),
    ("gpupool_vendor_allocated_ratio", VENDOR_LABELS),
    ("gpupool_vendor_memory_allocated_ratio", VENDOR_LABELS),
)


def _labelled_samples(snap: Snapshot) -> Iterator[tuple[str, list[str], float]]:
    for node in snap.nodes:
        for gpu in node.gpus:
            lv = [node.name, str(gpu.index), gpu.uuid, gpu.vendor, gpu.model]
            yield "gpupool_gpu_info", [*lv, gpu.runtime], 1
            yield "gpupool_gpu_healthy", lv, 1 if gpu.healthy else 0
            yield "gpupool_gpu_memory_bytes", lv, gpu.memory_mib * MIB
            yield "gpupool_gpu_memory_allocated_bytes", lv, gpu.allocated_memory_mib * MIB
            yield "gpupool_gpu_cores_allocated_ratio", lv, gpu.allocated_cores_percent / 100
            yield "gpupool_gpu_sharers", lv, gpu.sharers
            for g in gpu.grants:
                glv = [g.namespace, g.pod, g.container, g.node, str(g.gpu_index), g.gpu_uuid]
                yield "gpupool_grant_memory_bytes", glv, g.memory_mib * MIB
                yield "gpupool_grant_cores_ratio", glv, g.cores_percent / 100
            for p in gpu.partitions:
                yield "gpupool_gpu_partition_used", [*lv, p.profile, str(p.start)], 1 if p.used else 0
    for v in snap.totals.vendors:
        vlv = [v.vendor, v.runtime]
        yield "gpupool_vendor_gpus", vlv, v.gpus
        yield "gpupool_vendor_healthy_gpus", vlv, v.healthy_gpus
        yield "gpupool_vendor_memory_bytes", vlv, v.memory_mib * MIB
        yield "gpupool_vendor_allocated_ratio", vlv, v.allocated_share
        yield "gpupool_vendor_memory_allocated_ratio", vlv, v.allocated_memory_share


def _scalars(snap: Snapshot) -> list[tuple[str, float]]:
    t = snap.totals
    out: list[tuple[str, float]] = [
        ("gpupool_pool_nodes", t.nodes),
        ("gpupool_pool_gpus", t.gpus),
        ("gpupool_pool_healthy_gpus", t.healthy_gpus),
        ("gpupool_pool_allocated_ratio", t.allocated_share),
        ("gpupool_pool_memory_allocated_ratio", t.allocated_memory_share),
        ("gpupool_pool_fragmented_ratio", t.fragmented_share),
        ("gpupool_pool_gpu_pods", t.gpu_pods),
        ("gpupool_pending_gpu_pods", t.pending),
    ]
    if t.oldest_pending_seconds is not None:
        out.append(("gpupool_pending_gpu_pod_oldest_seconds", t.oldest_pending_seconds))
    return out


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


