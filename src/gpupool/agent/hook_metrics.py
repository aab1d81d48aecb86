"""Prometheus metrics from the hook directories, read at scrape time (no series outlives its pod), one
series per GPU container and GPU: gpupool_pod_gpu_memory_used_bytes, gpupool_pod_gpu_memory_limit_bytes
and gpupool_pod_gpu_busy_seconds_total, whose rate() is the container's busy-time share of the GPU (0..1).
Sum by pod_uid for the pod. `container` is "" for a directory an older agent made for the whole pod."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.agent.hookdir import read_all

LABELS = ["pod_uid", "pod", "container", "gpu"]


class HookUsageCollector(Collector):
    def __init__(self, root: Path) -> None:
        self.root = root

    def collect(self) -> Iterator[Metric]:
        used = GaugeMetricFamily("gpupool_pod_gpu_memory_used_bytes",
                                 "GPU memory the container's processes hold (allocations and contexts), from the hook",
                                 labels=LABELS)
        limit = GaugeMetricFamily("gpupool_pod_gpu_memory_limit_bytes",
                                  "The container's memory cap enforced by the hook (0 = none)", labels=LABELS)
        busy = CounterMetricFamily("gpupool_pod_gpu_busy_seconds",
                                   "GPU time the container's kernels occupied, measured by the hook; rate() = share",
                                   labels=LABELS)
        for u in read_all(self.root):
            values = [u.pod_uid, u.label, u.container, u.gpu]
            used.add_metric(values, u.used_bytes)
            limit.add_metric(values, u.limit_bytes)
            busy.add_metric(values, u.busy_seconds)
        yield used
        yield limit
        yield busy
