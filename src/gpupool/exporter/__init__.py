"""Prometheus metrics: the pool (who holds what, totals) and the devices
(dcgm-exporter-compatible), both as scrape-time collectors so series never outlive their pods."""

from gpupool.exporter.cgroup import PodInfo, PodRef, parse_cgroup, proc_pod_mapper, read_cgroup, resolve
from gpupool.exporter.device import DEVICE_METRICS, DeviceCollector, DeviceSample, ProcessSample
from gpupool.exporter.http import create_metrics_app, metrics_route
from gpupool.exporter.pool import PARTITION_METRICS, POOL_METRICS, PoolCollector

__all__ = [
    "DEVICE_METRICS",
    "PARTITION_METRICS",
    "POOL_METRICS",
    "DeviceCollector",
    "DeviceSample",
    "PodInfo",
    "PodRef",
    "PoolCollector",
    "ProcessSample",
    "create_metrics_app",
    "metrics_route",
    "parse_cgroup",
    "proc_pod_mapper",
    "read_cgroup",
    "resolve",
]
