"""Device metrics for the node agent, named and labelled like NVIDIA's dcgm-exporter.

Dashboards and alerts written for dcgm-exporter work unchanged: the same metric names, and the labels
`gpu` (index), `UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname` (the released dcgm-exporter
spelling) and `namespace`/`pod`/`container`.

Shared GPUs (the whole point of gpupool) are where dcgm-exporter attributes badly (peers: per-pod
metrics on shared GPUs are a top complaint). Here the two per-process quantities, utilisation and
framebuffer used, are split per pod from the per-process samples the agent takes from NVML: one series
per pod found on the GPU, plus one series with empty pod labels for whatever no known pod accounts
for, so that summing a metric over its series gives the device value. Device-wide quantities
(temperature, power, Xid) are one series per GPU with empty pod labels.

Every series also carries `vendor` (nvidia / amd / ascend): what the sample says, else the vendor of its model
in gpupool's catalogue (`gpupool.core.vendors`), else nvidia (as a card without a vendor always was). The
label is fixed by the card, so it adds no series; dcgm-exporter's own labels are kept as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.core.vendors import NVIDIA, vendor_of_model
from gpupool.exporter.cgroup import PodRef

log = logging.getLogger(__name__)

DEVICE_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "vendor", "container", "namespace",
                 "pod")

# dcgm-exporter field name -> help (units as dcgm-exporter's default counters).
DEVICE_METRICS: dict[str, str] = {
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_DEV_XID_ERRORS": "Value of the last XID error encountered.",
    "DCGM_EXP_XID_ERRORS_COUNT": "Count of XID errors since the agent started.",
}


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process using a GPU, as NVML reports it."""

    pid: int
    used_memory_mib: float = 0.0
    sm_util: float = 0.0  # percent of the GPU, from NVML process utilisation samples


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """One reading of one GPU. The agent fills it from NVML (or its fake)."""

    index: int
    uuid: str
    model: str
    hostname: str
    gpu_util: float  # percent
    fb_used_mib: float
    fb_total_mib: float
    temperature_c: float
    power_w: float
    last_xid: int = 0
    xid_count: int = 0
    pci_bus_id: str = ""
    minor: int | None = None  # /dev/nvidia<minor>; the index when unknown
    processes: tuple[ProcessSample, ...] = ()
    vendor: str = ""  # nvidia / amd / ascend; "": the catalogue's vendor of `model` (nvidia when unknown)

    @property
    def vendor_label(self) -> str:
        return self.vendor or vendor_of_model(self.model) or NVIDIA


class DeviceCollector(Collector):
    """Scrape-time collector over `provider` (the current samples) and `pod_of_pid` (PID -> pod, e.g.
    via `cgroup.resolve(read_cgroup(pid), pods)`); a process whose pod is unknown stays unattributed."""

    def __init__(
        self,
        provider: Callable[[], Sequence[DeviceSample]],
        pod_of_pid: Callable[[int], PodRef | None] = lambda pid: None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._provider = provider
        self._pod_of_pid = pod_of_pid
        if registry is not None:
            registry.register(self)

    def describe(self) -> list[Metric]:
        return [GaugeMetricFamily(name, help_, labels=()) for name, help_ in DEVICE_METRICS.items()]

    def collect(self) -> Iterator[Metric]:
        try:
            samples = list(self._provider())
        except Exception:
            log.exception("device sample provider failed")  # an empty scrape beats a failing one
            return
        yield from device_families(samples, self._pod_of_pid)


def device_families(
    samples: Sequence[DeviceSample], pod_of_pid: Callable[[int], PodRef | None]
) -> list[GaugeMetricFamily]:
    fam = {name: GaugeMetricFamily(name, help_, labels=DEVICE_LABELS) for name, help_ in DEVICE_METRICS.items()}
    for s in samples:
        base = [
            str(s.index), s.uuid, s.pci_bus_id, f"nvidia{s.index if s.minor is None else s.minor}",
            s.model, s.hostname, s.vendor_label,
        ]
        unmapped = [*base, "", "", ""]
        fam["DCGM_FI_DEV_FB_FREE"].add_metric(unmapped, max(0.0, s.fb_total_mib - s.fb_used_mib))
        fam["DCGM_FI_DEV_GPU_TEMP"].add_metric(unmapped, s.temperature_c)
        fam["DCGM_FI_DEV_POWER_USAGE"].add_metric(unmapped, s.power_w)
        fam["DCGM_FI_DEV_XID_ERRORS"].add_metric(unmapped, s.last_xid)
        fam["DCGM_EXP_XID_ERRORS_COUNT"].add_metric(unmapped, s.xid_count)
        per_pod = split_per_pod(s, pod_of_pid)
        mem_left, util_left = s.fb_used_mib, s.gpu_util
        for ref, (mem, util) in per_pod.items():
            labels = [*base, ref.container, ref.namespace, ref.pod]
            fam["DCGM_FI_DEV_FB_USED"].add_metric(labels, mem)
            fam["DCGM_FI_DEV_GPU_UTIL"].add_metric(labels, util)
            mem_left -= mem
            util_left -= util
        # The remainder (driver context, processes of unknown pods, sampling skew), never negative.
        fam["DCGM_FI_DEV_FB_USED"].add_metric(unmapped, max(0.0, mem_left))
        fam["DCGM_FI_DEV_GPU_UTIL"].add_metric(unmapped, max(0.0, util_left))
    return list(fam.values())


def split_per_pod(
    sample: DeviceSample, pod_of_pid: Callable[[int], PodRef | None]
) -> dict[PodRef, tuple[float, float]]:
    """Memory (MiB) and utilisation (%) of `sample` per pod, summed over that pod's processes. Shares
    are capped so that the pods together never exceed the device's own reading."""
    out: dict[PodRef, tuple[float, float]] = {}
    for p in sample.processes:
        ref = pod_of_pid(p.pid)
        if ref is None:
            continue
        mem, util = out.get(ref, (0.0, 0.0))
        out[ref] = (mem + p.used_memory_mib, util + p.sm_util)
    mem_sum = sum(m for m, _ in out.values())
    util_sum = sum(u for _, u in out.values())
    mem_scale = sample.fb_used_mib / mem_sum if mem_sum > sample.fb_used_mib > 0 else 1.0
    util_scale = sample.gpu_util / util_sum if util_sum > sample.gpu_util > 0 else 1.0
    if mem_sum > 0 and sample.fb_used_mib <= 0:
        mem_scale = 0.0
    if util_sum > 0 and sample.gpu_util <= 0:
        util_scale = 0.0
    return {ref: (m * mem_scale, u * util_scale) for ref, (m, u) in out.items()}
