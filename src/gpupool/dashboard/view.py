"""What the pool page shows, computed from a snapshot (pure, so the templates stay simple)."""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.api.snapshot import GPUView, NodeView, PendingPod, QueueView, Snapshot, Totals
from gpupool.core.vendors import UNIT_OF_VENDOR


@dataclass(frozen=True, slots=True)
class Share:
    """One pod's segment of a GPU bar."""

    pod: str  # namespace/name (or the bare name of a pod without namespace)
    container: str
    cores_percent: float
    memory_mib: int
    match: bool  # the pod matches the search


@dataclass(frozen=True, slots=True)
class PartitionCell:
    """One hardware partition of a GPU (MIG instance, AMD partition, Ascend vNPU) and who holds it."""

    profile: str
    start: int
    memory_mib: int  # 0: no geometry known
    compute: str  # "38 CU", "42 SM", "8 AI Core"; "" when unknown
    used: bool
    pod: str  # namespace/name of the holder ("" when none is known)
    match: bool  # the holder matches the search


@dataclass(frozen=True, slots=True)
class GPUCell:
    gpu: GPUView
    shares: tuple[Share, ...]
    free_percent: float
    memory_percent: float
    match: bool
    partitions: tuple[PartitionCell, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    cells: tuple[GPUCell, ...]
    remote_server: str = ""  # its GPU server for remote shares ("": none)
    remote_shares: int = 0


@dataclass(frozen=True, slots=True)
class PoolView:
    totals: Totals
    rows: tuple[NodeRow, ...]
    pending: tuple[PendingPod, ...]
    query: str
    matches: int  # nodes, grants and pending pods matching the search (0 without a search)
    taken_at: float | None
    hidden_nodes: int = 0  # nodes left out to keep the page small (see `max_nodes`)
    queues: tuple[QueueView, ...] = ()  # team queues, when the cluster defines any


def pod_name(namespace: str, pod: str) -> str:
    return f"{namespace}/{pod}" if namespace else pod


def _matches(q: str, namespace: str, pod: str) -> bool:
    return bool(q) and q.lower() in pod_name(namespace, pod).lower()


def _cell(gpu: GPUView, q: str) -> GPUCell:
    shares = tuple(
        Share(pod_name(g.namespace, g.pod), g.container, g.cores_percent, g.memory_mib, _matches(q, g.namespace, g.pod))
        for g in gpu.grants
    )
    memory = 100 * gpu.allocated_memory_mib / gpu.memory_mib if gpu.memory_mib else 0.0
    unit = UNIT_OF_VENDOR.get(gpu.vendor, "units")
    parts = tuple(
        PartitionCell(p.profile, p.start, p.memory_mib, f"{p.compute_units} {unit}" if p.compute_units else "",
                      p.used, p.pod, bool(q) and q.lower() in p.pod.lower())
        for p in gpu.partitions
    )
    return GPUCell(gpu, shares, max(0.0, 100 - gpu.allocated_cores_percent), memory, any(s.match for s in shares),
                   parts)


def _row(node: NodeView, q: str) -> NodeRow:
    return NodeRow(node.name, tuple(_cell(g, q) for g in node.gpus), node.remote_server, node.remote_shares)


def pool_view(snap: Snapshot, q: str = "", max_nodes: int = 0) -> PoolView:
    """The page for `snap`. With a search `q` (case-insensitive substring of namespace/pod or of a node
    name) only matching nodes, nodes holding a matching pod, and matching pending pods are listed. At most
    `max_nodes` nodes are listed (0 = all); the rest are counted in `hidden_nodes`."""
    needle = q.lower()
    rows: list[NodeRow] = []
    hidden = matches = 0
    for node in snap.nodes:
        row = _row(node, q)
        if q:
            pods = sum(s.match for c in row.cells for s in c.shares)
            by_name = needle in node.name.lower()
            if not pods and not by_name:
                continue
            matches += pods + by_name
        if max_nodes and len(rows) >= max_nodes:
            hidden += 1
            continue
        rows.append(row)
    pending = tuple(p for p in snap.pending if not q or _matches(q, p.namespace, p.pod))
    if q:
        matches += len(pending)
    return PoolView(snap.totals, tuple(rows), pending, q, matches, snap.taken_at, hidden, tuple(snap.queues))
