"""What the pool page shows, computed from a snapshot (pure, so the templates stay simple)."""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.api.snapshot import GPUView, NodeView, PendingPod, Snapshot, Totals


@dataclass(frozen=True, slots=True)
class Share:
    """One pod's segment of a GPU bar."""

    pod: str  # namespace/name (or the bare name of a pod without namespace)
    container: str
    cores_percent: float
    memory_mib: int
    match: bool  # the pod matches the search


@dataclass(frozen=True, slots=True)
class GPUCell:
    gpu: GPUView
    shares: tuple[Share, ...]
    free_percent: float
    memory_percent: float
    match: bool


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    cells: tuple[GPUCell, ...]


@dataclass(frozen=True, slots=True)
class PoolView:
    totals: Totals
    rows: tuple[NodeRow, ...]
    pending: tuple[PendingPod, ...]
    query: str
    matches: int  # grants + pending pods matching the search (0 without a search)
    taken_at: float | None


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
    return GPUCell(gpu, shares, max(0.0, 100 - gpu.allocated_cores_percent), memory, any(s.match for s in shares))


def _row(node: NodeView, q: str) -> NodeRow:
    return NodeRow(node.name, tuple(_cell(g, q) for g in node.gpus))


def pool_view(snap: Snapshot, q: str = "") -> PoolView:
    """The page for `snap`; with a search `q` (case-insensitive substring of namespace/pod), only nodes
    holding a matching pod and matching pending pods are listed."""
    rows = tuple(_row(n, q) for n in snap.nodes)
    pending = tuple(snap.pending)
    matches = 0
    if q:
        rows = tuple(r for r in rows if any(c.match for c in r.cells))
        pending = tuple(p for p in pending if _matches(q, p.namespace, p.pod))
        matches = sum(s.match for r in rows for c in r.cells for s in c.shares) + len(pending)
    return PoolView(snap.totals, rows, pending, q, matches, snap.taken_at)
