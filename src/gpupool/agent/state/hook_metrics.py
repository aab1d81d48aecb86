"""Prometheus metrics from the hook directories, read at scrape time (no series outlives its pod).

Per GPU container and GPU: gpupool_pod_gpu_memory_used_bytes, gpupool_pod_gpu_memory_limit_bytes and
gpupool_pod_gpu_busy_seconds_total, whose rate() is the container's busy-time share of the GPU (0..1).
`container` is "" for a directory an older agent made for the whole pod.

Per pod (summed over its containers and GPUs), what a HorizontalPodAutoscaler scales on: how much of its
share the pod uses (docs/autoscaling.md). Labelled `namespace` and `pod` (the pod's name) as
prometheus-adapter and KEDA's queries expect. A DRA claim's share (one directory for every container using
the claim) has the claim's name in `claim` and `pod` empty: which of its pods used it is not known. A remote
share is served by the GPU node's agent (its GPU server's workers write the accounting there), under its
claim's name the same way.

- gpupool_pod_share_compute_seconds_total: busy seconds over the compute granted, in GPUs. rate() is the
  fraction of its compute share the pod keeps busy: 0.5 = half its share, 1 = all of it (a hard cap keeps
  it there; an elastic pod may go above).
- gpupool_pod_share_granted_gpus: the compute granted, in GPUs (0.2 = 20 % of one GPU).
- gpupool_pod_share_memory_used_ratio: memory held over the memory cap, over the GPUs that have a cap (absent
  when none has).
- gpupool_pod_share_memory_used_bytes / gpupool_pod_share_memory_cap_bytes: the two sums behind the ratio.

The compute granted comes from every limits.v1 of the pod, including containers whose library has not
written its accounting yet: the denominator is fixed for the pod's life, so the counter only resets when the
library's own busy time does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.agent.state.hookdir import (
    PodGpuUsage,
    claim_roots,
    hook_dirs,
    hook_paths,
    limits_dir,
    read_all,
    read_limits,
    valid_uid,
)

LABELS = ["pod_uid", "pod", "container", "gpu"]
POD_LABELS = ["namespace", "pod", "claim", "pod_uid"]
CLAIM_SUFFIX = " (claim)"  # gpupool.agent.dra.driver labels a claim's directory "<namespace>/<claim> (claim)"
_PPM = 1_000_000


@dataclass(frozen=True, slots=True)
class PodShare:
    """One pod's (or one DRA claim's) use of what it was granted, summed over its containers and GPUs."""

    uid: str
    namespace: str
    pod: str  # "" for a claim
    claim: str  # "" for a pod
    busy_seconds: float  # GPU time its kernels occupied, cumulative
    granted_gpus: float  # compute granted, in GPUs (sum of cores percent / 100)
    used_bytes: int  # memory held, on every GPU
    capped_used_bytes: int  # memory held on the GPUs that have a cap
    cap_bytes: int  # sum of the caps (0 = no GPU of the pod has one)

    @property
    def compute_share_seconds(self) -> float:
        """busy / granted: its rate() is the fraction of the granted compute in use."""
        return self.busy_seconds / self.granted_gpus if self.granted_gpus > 0 else 0.0

    @property
    def memory_used_ratio(self) -> float | None:
        return self.capped_used_bytes / self.cap_bytes if self.cap_bytes > 0 else None


def split_label(label: str) -> tuple[str, str, str]:
    """(namespace, pod, claim) from a hook directory's `namespace/name` or `namespace/claim (claim)` label."""
    namespace, _, name = label.partition("/")
    if name.endswith(CLAIM_SUFFIX):
        return namespace, "", name[: -len(CLAIM_SUFFIX)]
    return namespace, name, ""


def pod_shares(records: Iterable[PodGpuUsage], granted: Mapping[str, float]) -> list[PodShare]:
    """Sum the per-container, per-GPU records by pod UID. `granted` is each pod's compute in GPUs from its
    limits files (granted_gpus); a pod missing there is granted what its records say (an older agent's
    directory without limits.v1)."""
    by_uid: dict[str, list[PodGpuUsage]] = {}
    for r in records:
        by_uid.setdefault(r.pod_uid, []).append(r)
    out = []
    for uid, rs in sorted(by_uid.items()):
        namespace, pod, claim = split_label(next((r.label for r in rs if r.label), ""))
        capped = [r for r in rs if r.limit_bytes > 0]
        out.append(PodShare(
            uid=uid, namespace=namespace, pod=pod, claim=claim,
            busy_seconds=sum(r.busy_seconds for r in rs),
            granted_gpus=granted.get(uid, sum(r.cores_percent for r in rs) / 100),
            used_bytes=sum(r.used_bytes for r in rs),
            capped_used_bytes=sum(r.used_bytes for r in capped),
            cap_bytes=sum(r.limit_bytes for r in capped),
        ))
    return out


def _limits_gpus(directory: Path) -> float | None:
    """The compute limits.v1 in `directory` grants, in GPUs (a 0 cores value is an uncapped GPU: 1)."""
    limits = read_limits(limits_dir(directory))
    if limits is None:
        return None
    return sum((c or _PPM) / _PPM for c in limits["cores"][: limits["ndev"]])


def granted_gpus(root: Path) -> dict[str, float]:
    """Pod (or claim) UID -> compute granted in GPUs, from the limits files of all its directories. A pod
    with a directory lacking limits.v1 is left out (its records say what it was granted)."""
    out: dict[str, float] = {}
    dirs: list[tuple[str, list[Path]]] = []
    for base, listing in ((hook_paths(root).pods, True), *((c, False) for c in claim_roots(root))):
        try:
            entries = sorted(e for e in base.iterdir() if e.is_dir() and valid_uid(e.name))
        except OSError:
            continue
        dirs += [(e.name, hook_dirs(root, e.name) if listing else [e]) for e in entries]
    for uid, directories in dirs:
        values = [_limits_gpus(d) for d in directories]
        if values and all(v is not None for v in values):
            out[uid] = sum(v for v in values if v is not None)
    return out


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
        records = read_all(self.root)
        for u in records:
            values = [u.pod_uid, u.label, u.container, u.gpu]
            used.add_metric(values, u.used_bytes)
            limit.add_metric(values, u.limit_bytes)
            busy.add_metric(values, u.busy_seconds)
        yield used
        yield limit
        yield busy
        yield from pod_share_families(pod_shares(records, granted_gpus(self.root)))


def pod_share_families(shares: Iterable[PodShare]) -> Iterator[Metric]:
    compute = CounterMetricFamily(
        "gpupool_pod_share_compute_seconds",
        "The pod's GPU busy time over the compute it was granted (in GPUs); rate() = fraction of its share in use",
        labels=POD_LABELS)
    granted = GaugeMetricFamily("gpupool_pod_share_granted_gpus",
                                "Compute granted to the pod over all its GPU containers, in GPUs", labels=POD_LABELS)
    ratio = GaugeMetricFamily("gpupool_pod_share_memory_used_ratio",
                              "GPU memory the pod holds over its memory cap (GPUs with a cap only)",
                              labels=POD_LABELS)
    used = GaugeMetricFamily("gpupool_pod_share_memory_used_bytes",
                             "GPU memory the pod holds on the GPUs that have a cap", labels=POD_LABELS)
    cap = GaugeMetricFamily("gpupool_pod_share_memory_cap_bytes",
                            "The pod's memory caps summed (0: no GPU of the pod is capped)", labels=POD_LABELS)
    for s in shares:
        values = [s.namespace, s.pod, s.claim, s.uid]
        compute.add_metric(values, s.compute_share_seconds)
        granted.add_metric(values, s.granted_gpus)
        used.add_metric(values, s.capped_used_bytes)
        cap.add_metric(values, s.cap_bytes)
        if (r := s.memory_used_ratio) is not None:
            ratio.add_metric(values, r)
    yield from (compute, granted, ratio, used, cap)
