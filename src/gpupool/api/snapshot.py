"""The pool snapshot: one JSON document that says who uses which GPU, what is free, and what waits.

It is the contract between the scheduler (which owns the `ClusterState`) and every view of the pool:
the Prometheus exporter, the web dashboard and `gpupool top`. The scheduler builds it with
`build_snapshot` (pure: no clock, no I/O; time is passed in) and serves it as JSON at `GET /pool`;
readers parse it with `Snapshot.model_validate_json`.

Units: memory in MiB, compute in percent of one GPU (milli-GPU / 10), shares of the pool in 0..1.

Fragmentation ("fragmented_share") is the FGD measure of `gpupool.core.frag` (Weng et al., ATC'23):
the free compute of healthy GPUs that a task drawn from the expected workload could not use, weighted
by task popularity, divided by the pool's total compute. The scheduler passes its workload (the typical
task shapes it has seen); without one, the default is a single whole-GPU task, and the measure then
reads "free compute stranded on partly used GPUs" (a GPU with 30 % handed out strands its other 70 %).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from gpupool.core.frag import WorkloadArrays, cluster_fragmentation
from gpupool.core.model import MILLI_PER_GPU
from gpupool.core.policy import TaskShape
from gpupool.core.state import ClusterState

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
) -> Snapshot:
    """Describe `state` for the views. `pending` maps pod key ("namespace/name") -> why it waits. `names`
    maps the keys pods have inside `state` to "namespace/name" when they differ (the scheduler's ledger
    keys pods by UID); `containers` maps the same state keys to the container holding the GPU (blank when
    unknown); `pending_since` maps pending pod keys -> unix seconds they started waiting (with `now`,
    gives the oldest wait); `workload` drives the fragmentation measure; `servers` maps node names to their
    GPU server's address and the remote shares it serves (docs/remote.md)."""
    names = names or {}
    containers = containers or {}
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
            })
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
             "grants": grants_by_gpu.get((i, j), [])}
            for j, gpu in enumerate(node.gpus)
        ]}
        for i, node in enumerate(state.nodes)
    ]
    waiting = [_pending_view(k, r, pending_since) for k, r in sorted(pending.items())]
    totals = _totals(state, waiting, grants, gpu_pods, now, workload)
    return Snapshot.model_validate({"taken_at": now, "nodes": nodes, "pending": waiting, "totals": totals})


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
