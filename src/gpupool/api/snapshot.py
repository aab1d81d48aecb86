"""The pool snapshot: one JSON document that says who uses which GPU, what is free, and what waits.

It is the contract between the scheduler (which owns the `ClusterState`) and every view of the pool:
the Prometheus exporter, the web dashboard and `gpupool top`. The scheduler builds it with
`build_snapshot` (pure: no clock, no I/O; time is passed in) and serves it as JSON at `GET /pool`;
readers parse it with `Snapshot.model_validate_json`.

Units: memory in MiB, compute in percent of one GPU (milli-GPU / 10), shares of the pool in 0..1.

Vendors are data here: each GPU carries its vendor and the runtime its cards run (cuda / rocm / cann, from
`gpupool.core.vendors`), the hardware partitions on it (NVIDIA MIG instances, AMD compute/memory-mode
partitions, Ascend vNPUs: whatever the node agent reports, with the partitions the scheduler's pods hold laid
over it), and `totals.vendors` sums the pool per vendor so a mixed pool shows each vendor's share.

Fragmentation ("fragmented_share") is the FGD measure of `gpupool.core.frag` (Weng et al., ATC'23):
the free compute of healthy GPUs that a task drawn from the expected workload could not use, weighted
by task popularity, divided by the pool's total compute. The scheduler passes its workload (the typical
task shapes it has seen); without one, the default is a single whole-GPU task, and the measure then
reads "free compute stranded on partly used GPUs" (a GPU with 30 % handed out strands its other 70 %).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field

from gpupool.core.frag import WorkloadArrays, cluster_fragmentation
from gpupool.core.mig import mig_model
from gpupool.core.model import MILLI_PER_GPU
from gpupool.core.partitions import partition_model
from gpupool.core.policy import TaskShape
from gpupool.core.state import ClusterState
from gpupool.core.vendors import runtime_of

SNAPSHOT_VERSION = "gpupool.io/snapshot/v1"

# The default workload for the fragmentation measure: one whole GPU.
WHOLE_GPU_TASK = TaskShape(cpu_milli=0, gpu_milli=MILLI_PER_GPU, gpu_count=1)


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GrantView(_Wire):
    """One pod's share of one GPU."""

    namespace: str
    pod: str
    container: str = ""
    node: str
    gpu_uuid: str
    gpu_index: int
    memory_mib: int = Field(ge=0)
    cores_percent: float = Field(ge=0, le=100)
    partition: str = ""  # the profile of the hardware partition serving it ("": a share of the whole card)


class PartitionView(_Wire):
    """A hardware partition of a card: a MIG instance (NVIDIA, "3g.40gb"), a compute/memory-mode partition
    (AMD, "CPX/NPS4"), a vNPU (Ascend, "vir08")."""

    profile: str
    start: int = Field(ge=0)  # MIG: first memory slice; AMD: first XCC; Ascend: vNPU index on the card
    memory_mib: int = Field(default=0, ge=0)  # from the model's geometry; 0 where gpupool has none
    compute_units: int = Field(default=0, ge=0)  # SMs / CUs / AI Cores; 0 where unknown
    used: bool = False  # a pod holds it (or it is being made or destroyed)
    pod: str = ""  # "namespace/name" of the pod the scheduler gave it to ("": none known)


class GPUView(_Wire):
    uuid: str
    index: int = Field(ge=0)
    model: str
    memory_mib: int = Field(ge=0)
    healthy: bool
    allocated_memory_mib: int = Field(ge=0)
    allocated_cores_percent: float = Field(ge=0, le=100)
    sharers: int = Field(ge=0)
    grants: list[GrantView] = Field(default_factory=list)
    vendor: str = "nvidia"  # nvidia / amd / ascend (gpupool.core.vendors)
    runtime: str = ""  # the runtime its pods run: cuda / rocm / cann ("": a vendor gpupool does not know)
    partitions: list[PartitionView] = Field(default_factory=list)  # empty: not partitioned


class NodeView(_Wire):
    name: str
    gpus: list[GPUView] = Field(default_factory=list)
    remote_server: str = ""  # the node's GPU server for remote shares while it is up ("": none)
    remote_shares: int = 0  # remote shares it serves now


class PendingPod(_Wire):
    namespace: str
    pod: str
    reason: str
    since: float | None = None  # unix seconds the pod started waiting, when the scheduler knows it


class QueueView(_Wire):
    """A team queue (gpupool.io GPUQueue) in GPUs; None where unlimited."""

    name: str
    used_gpus: float = Field(ge=0)
    guaranteed_gpus: float = Field(ge=0)
    maximum_gpus: float | None = None
    borrowed_gpus: float = Field(default=0, ge=0)
    lent_gpus: float = Field(default=0, ge=0)
    pending: int = Field(default=0, ge=0)


class VendorTotals(_Wire):
    """One vendor's part of the pool (its healthy and unhealthy cards)."""

    vendor: str
    runtime: str  # "" for a vendor gpupool does not know
    gpus: int = Field(ge=0)
    healthy_gpus: int = Field(ge=0)
    memory_mib: int = Field(ge=0)
    allocated_memory_mib: int = Field(ge=0)
    allocated_share: float = Field(ge=0, le=1)  # compute handed out on its cards / their compute
    allocated_memory_share: float = Field(ge=0, le=1)


class Totals(_Wire):
    nodes: int = Field(ge=0)
    gpus: int = Field(ge=0)
    healthy_gpus: int = Field(ge=0)
    memory_mib: int = Field(ge=0)
    allocated_memory_mib: int = Field(ge=0)
    allocated_share: float = Field(ge=0, le=1)  # compute handed out / total compute
    allocated_memory_share: float = Field(ge=0, le=1)
    fragmented_share: float = Field(ge=0, le=1)  # see the module docstring
    grants: int = Field(ge=0)
    gpu_pods: int = Field(ge=0)
    pending: int = Field(ge=0)
    oldest_pending_seconds: float | None = None
    vendors: list[VendorTotals] = Field(default_factory=list)  # one per vendor with cards, by name


class Snapshot(_Wire):
    version: str = SNAPSHOT_VERSION
    taken_at: float | None = None  # unix seconds, as passed to build_snapshot
    nodes: list[NodeView]
    pending: list[PendingPod]
    totals: Totals
    queues: list[QueueView] = Field(default_factory=list)  # empty when the cluster defines no queue

    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    def grants(self) -> list[GrantView]:
        return [g for n in self.nodes for gpu in n.gpus for g in gpu.grants]


def split_key(key: str) -> tuple[str, str]:
    """Pod key "namespace/name" -> (namespace, name); a key without "/" (trace pods) has no namespace."""
    ns, sep, name = key.partition("/")
    return (ns, name) if sep else ("", key)


def fragmented_milli(state: ClusterState, workload: Sequence[TaskShape] = ()) -> float:
    """Expected free compute (milli-GPU) that a task drawn from `workload` could not use (core FGD measure)."""
    tasks = tuple(t for t in workload if t.weight > 0) or (WHOLE_GPU_TASK,)
    # The core measure sums weight x fragment; weights are popularities, so make them sum to 1.
    total = sum(t.weight for t in tasks)
    tasks = tuple(dataclasses.replace(t, weight=t.weight / total) for t in tasks)
    return float(cluster_fragmentation(state, WorkloadArrays.build(state, tasks)).sum())


def build_snapshot(
    state: ClusterState,
    pending: Mapping[str, str],
    *,
    names: Mapping[str, str] | None = None,
    containers: Mapping[str, str] | None = None,
    pending_since: Mapping[str, float] | None = None,
    now: float | None = None,
    workload: Sequence[TaskShape] = (),
    servers: Mapping[str, tuple[str, int]] | None = None,
    partitions: Mapping[str, Sequence[tuple[str, int, bool]]] | None = None,
) -> Snapshot:
    """Describe `state` for the views. `pending` maps pod key ("namespace/name") -> why it waits. `names`
    maps the keys pods have inside `state` to "namespace/name" when they differ (the scheduler's ledger
    keys pods by UID); `containers` maps the same state keys to the container holding the GPU (blank when
    unknown); `pending_since` maps pending pod keys -> unix seconds they started waiting (with `now`,
    gives the oldest wait); `workload` drives the fragmentation measure; `servers` maps node names to their
    GPU server's address and the remote shares it serves (docs/remote.md); `partitions` maps GPU UUIDs to the
    hardware partitions their node's agent reports (profile, start, used), to which the partitions that
    granted pods hold are added (the agent reports one only after it was carved)."""
    names = names or {}
    containers = containers or {}
    reported = partitions or {}
    held_parts: dict[str, dict[tuple[str, int], str]] = {}  # GPU UUID -> (profile, start) -> pod holding it
    # Plain dicts validated once at the end: one pass in pydantic's core instead of ~30,000 model inits.
    grants_by_gpu: dict[tuple[int, int], list[dict[str, object]]] = {}
    gpu_pods = grants = 0
    for key, held in list(state.held.items()):
        if not held.allocation.grants:
            continue
        gpu_pods += 1
        ns, name = split_key(names.get(key, key))
        for g in held.allocation.grants:
            grants += 1
            grants_by_gpu.setdefault((held.node_index, g.index), []).append({
                "namespace": ns, "pod": name, "container": containers.get(key, ""), "node": held.allocation.node,
                "gpu_uuid": g.uuid, "gpu_index": g.index, "memory_mib": g.memory_mib, "cores_percent": g.milli / 10,
                "partition": g.mig.profile if g.mig is not None else "",
            })
            if g.mig is not None:
                held_parts.setdefault(g.uuid, {})[(g.mig.profile, g.mig.start)] = f"{ns}/{name}" if ns else name
    for shares in grants_by_gpu.values():
        shares.sort(key=lambda d: (d["namespace"], d["pod"]))
    healthy = state.gpu_healthy.tolist()
    mem_used = (state.gpu_mem_total - state.gpu_mem_free).tolist()
    milli_used = (MILLI_PER_GPU - state.gpu_milli_free).tolist()
    sharers = state.gpu_sharers.tolist()
    servers = servers or {}
    nodes = [
        {"name": node.name, "remote_server": servers.get(node.name, ("", 0))[0],
         "remote_shares": servers.get(node.name, ("", 0))[1], "gpus": [
            {"uuid": gpu.uuid, "index": gpu.index, "model": gpu.model, "memory_mib": gpu.memory_mib,
             "healthy": healthy[i][j], "allocated_memory_mib": mem_used[i][j],
             "allocated_cores_percent": milli_used[i][j] / 10, "sharers": sharers[i][j],
             "grants": grants_by_gpu.get((i, j), []), "vendor": gpu.vendor, "runtime": _runtime(gpu.vendor),
             "partitions": _partition_views(gpu.model, reported.get(gpu.uuid, ()), held_parts.get(gpu.uuid, {}))
             if gpu.uuid in reported or gpu.uuid in held_parts else []}
            for j, gpu in enumerate(node.gpus)
        ]}
        for i, node in enumerate(state.nodes)
    ]
    waiting = [_pending_view(k, r, pending_since) for k, r in sorted(pending.items())]
    totals = _totals(state, waiting, grants, gpu_pods, now, workload).model_copy(
        update={"vendors": _vendor_totals(state, healthy, mem_used, milli_used)})
    return Snapshot.model_validate({"taken_at": now, "nodes": nodes, "pending": waiting, "totals": totals})


@lru_cache(maxsize=64)
def _runtime(vendor: str) -> str:
    return runtime_of(vendor) or ""


def _partition_views(model: str, reported: Sequence[tuple[str, int, bool]],
                     held: Mapping[tuple[str, int], str]) -> list[dict[str, object]]:
    """The partitions of one card, by start: the agent's report with the scheduler's claims laid over it."""
    used = {(profile, start): flag for profile, start, flag in reported}
    used.update(dict.fromkeys(held, True))  # granted: used even before the agent reports it carved
    out: list[dict[str, object]] = []
    for profile, start in sorted(used, key=lambda ps: (ps[1], ps[0])):
        memory, units = _partition_size(model, profile)
        out.append({"profile": profile, "start": start, "memory_mib": memory, "compute_units": units,
                    "used": used[(profile, start)], "pod": held.get((profile, start), "")})
    return out


@lru_cache(maxsize=1024)
def _partition_size(model: str, profile: str) -> tuple[int, int]:
    """(memory MiB, compute units) of a profile on a model, from the MIG or AMD/Ascend geometry; (0, 0) when
    gpupool has no geometry for the pair (the card is still shown with what the agent reported)."""
    mig = mig_model(model)
    found = mig.profile(profile) if mig is not None else None
    if found is not None:
        return found.memory_mib, found.sm_count or 0
    part = partition_model(model)
    other = part.profile(profile) if part is not None else None
    if other is not None:
        return other.memory_mib, other.compute_units
    return 0, 0


def _vendor_totals(state: ClusterState, healthy: list[list[bool]], mem_used: list[list[int]],
                   milli_used: list[list[int]]) -> list[VendorTotals]:
    """Per vendor (by name): its cards, memory and what is handed out; the sums over vendors are the pool's
    totals (compute as `ClusterState.allocated_milli` counts it)."""
    acc: dict[str, list[int]] = {}  # vendor -> [gpus, healthy, memory, memory handed out, milli handed out]
    for i, node in enumerate(state.nodes):
        for j, gpu in enumerate(node.gpus):
            row = acc.setdefault(gpu.vendor, [0, 0, 0, 0, 0])
            row[0] += 1
            row[1] += bool(healthy[i][j])
            row[2] += gpu.memory_mib
            row[3] += mem_used[i][j]
            row[4] += milli_used[i][j]
    return [
        VendorTotals(vendor=v, runtime=_runtime(v), gpus=n, healthy_gpus=ok, memory_mib=mem,
                     allocated_memory_mib=mem_alloc, allocated_share=_ratio(milli, MILLI_PER_GPU * n),
                     allocated_memory_share=_ratio(mem_alloc, mem))
        for v, (n, ok, mem, mem_alloc, milli) in sorted(acc.items())
    ]


def _pending_view(key: str, reason: str, since: Mapping[str, float] | None) -> PendingPod:
    ns, name = split_key(key)
    return PendingPod(namespace=ns, pod=name, reason=reason, since=(since or {}).get(key))


def _totals(
    state: ClusterState,
    pending: Sequence[PendingPod],
    grants: int,
    gpu_pods: int,
    now: float | None,
    workload: Sequence[TaskShape],
) -> Totals:
    present = state.gpu_present
    total_milli = MILLI_PER_GPU * state.total_gpus
    mem_total = int(state.gpu_mem_total.sum())
    mem_alloc = int((state.gpu_mem_total - state.gpu_mem_free)[present].sum())
    waits = [now - p.since for p in pending if p.since is not None and now is not None]
    return Totals(
        nodes=len(state.nodes),
        gpus=state.total_gpus,
        healthy_gpus=int((present & state.gpu_healthy).sum()),
        memory_mib=mem_total,
        allocated_memory_mib=mem_alloc,
        allocated_share=_ratio(state.allocated_milli(), total_milli),
        allocated_memory_share=_ratio(mem_alloc, mem_total),
        fragmented_share=_ratio(fragmented_milli(state, workload), total_milli),
        grants=grants,
        gpu_pods=gpu_pods,
        pending=len(pending),
        oldest_pending_seconds=max(0.0, max(waits)) if waits else None,
    )


def _ratio(part: float, whole: float) -> float:
    return min(1.0, part / whole) if whole > 0 else 0.0
