"""The free capacity of a set of nodes, kept in numpy arrays so that policies score all nodes at once.

`ClusterState` is the single place where capacity is consumed and returned. `allocate` refuses (returns
a reason) rather than ever letting a GPU go over capacity in either dimension; `release` gives back
exactly what was taken. The scheduler's ledger and the simulator both drive it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpupool.core.model import GPU, MILLI_PER_GPU, Allocation, GPUGrant, Node, PodRequest

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Held:
    """What one allocation holds, so release can give back exactly that."""

    allocation: Allocation
    node_index: int
    cpu_milli: int
    memory_mib: int


class ClusterState:
    """Free CPU, memory and per-GPU compute/memory of every node. Padding GPU slots are absent (False
    in `gpu_present`) with zero capacity, so vectorised checks never select them."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        self.nodes: list[Node] = list(nodes)
        self.index: dict[str, int] = {}
        for i, n in enumerate(self.nodes):
            if n.name in self.index:
                raise ValueError(f"duplicate node name {n.name!r}")
            self.index[n.name] = i
        n_nodes = len(self.nodes)
        width = max((len(n.gpus) for n in self.nodes), default=0)
        self.width = max(width, 1)
        self.cpu_total = np.array([n.cpu_milli for n in self.nodes], dtype=np.int64)
        self.mem_total = np.array([n.memory_mib for n in self.nodes], dtype=np.int64)
        self.cpu_free = self.cpu_total.copy()
        self.mem_free = self.mem_total.copy()
        shape = (n_nodes, self.width)
        self.gpu_present: BoolArray = np.zeros(shape, dtype=bool)
        self.gpu_healthy: BoolArray = np.zeros(shape, dtype=bool)
        self.gpu_mem_total: IntArray = np.zeros(shape, dtype=np.int64)
        self.gpu_milli_free: IntArray = np.zeros(shape, dtype=np.int64)
        self.gpu_mem_free: IntArray = np.zeros(shape, dtype=np.int64)
        self.gpu_sharers: IntArray = np.zeros(shape, dtype=np.int64)
        # Pods one GPU may hold at most (0: no limit). The scheduler holds each GPU to its node's `split` in a
        # Filter plugin; the simulator sets this for --max-shares-per-gpu (off by default, as in FGD's protocol).
        self.max_sharers = 0
        self.models: list[str] = []
        model_ids: dict[str, int] = {}
        self.gpu_model: IntArray = np.full(shape, -1, dtype=np.int64)
        for i, n in enumerate(self.nodes):
            for j, g in enumerate(n.gpus):
                self.gpu_present[i, j] = True
                self.gpu_healthy[i, j] = g.healthy
                self.gpu_mem_total[i, j] = g.memory_mib
                self.gpu_milli_free[i, j] = MILLI_PER_GPU
                self.gpu_mem_free[i, j] = g.memory_mib
                if g.model not in model_ids:
                    model_ids[g.model] = len(self.models)
                    self.models.append(g.model)
                self.gpu_model[i, j] = model_ids[g.model]
        self.gpu_count = self.gpu_present.sum(axis=1).astype(np.int64)
        self.total_gpus = int(self.gpu_count.sum())
        self.held: dict[str, Held] = {}
        self.node_pods: list[set[str]] = [set() for _ in self.nodes]  # pod keys holding capacity per node
        # Bumped on every change of a node; policies key their per-node caches on it.
        self.node_version: IntArray = np.zeros(n_nodes, dtype=np.int64)
        # Bumped on every change of any node: a memo of something that depends on the whole cluster
        # (not one node) is valid while this is unchanged.
        self.version = 0

    def __len__(self) -> int:
        return len(self.nodes)

    def model_id(self, model: str) -> int:
        try:
            return self.models.index(model)
        except ValueError:
            return -1

    # --- consuming and returning capacity -------------------------------------------------------------

    def allocate(self, pod: PodRequest, allocation: Allocation) -> str | None:
        """Take the capacity of `allocation`. Returns None on success, else why it was refused; on
        refusal nothing changes."""
        if pod.key in self.held:
            return f"pod {pod.key} already holds an allocation on {self.held[pod.key].allocation.node}"
        i = self.index.get(allocation.node)
        if i is None:
            return f"unknown node {allocation.node}"
        if self.cpu_free[i] < pod.cpu_milli or self.mem_free[i] < pod.memory_mib:
            return f"node {allocation.node} lacks CPU or memory for {pod.key}"
        seen: set[int] = set()
        node = self.nodes[i]
        for g in allocation.grants:
            j = g.index
            if j in seen or not 0 <= j < len(node.gpus) or node.gpus[j].uuid != g.uuid:
                return f"grant for GPU {g.index} ({g.uuid}) does not match node {node.name}"
            seen.add(j)
            if g.milli <= 0 or g.memory_mib < 0:
                return f"grant on GPU {j} of {node.name} is not positive"
            if self.gpu_milli_free[i, j] < g.milli or self.gpu_mem_free[i, j] < g.memory_mib:
                return f"GPU {j} of {node.name} has too little free compute or memory"
        for g in allocation.grants:
            self.gpu_milli_free[i, g.index] -= g.milli
            self.gpu_mem_free[i, g.index] -= g.memory_mib
            self.gpu_sharers[i, g.index] += 1
        self.cpu_free[i] -= pod.cpu_milli
        self.mem_free[i] -= pod.memory_mib
        self.node_version[i] += 1
        self.version += 1
        self.held[pod.key] = Held(allocation, i, pod.cpu_milli, pod.memory_mib)
        self.node_pods[i].add(pod.key)
        return None

    def release(self, pod_key: str) -> Allocation | None:
        """Give back what `pod_key` holds; returns the released allocation (None if it held nothing)."""
        held = self.held.pop(pod_key, None)
        if held is None:
            return None
        i = held.node_index
        self.node_pods[i].discard(pod_key)
        for g in held.allocation.grants:
            self.gpu_milli_free[i, g.index] += g.milli
            self.gpu_mem_free[i, g.index] += g.memory_mib
            self.gpu_sharers[i, g.index] -= 1
        self.cpu_free[i] += held.cpu_milli
        self.mem_free[i] += held.memory_mib
        self.node_version[i] += 1
        self.version += 1
        return held.allocation

    def regrant(self, pod_key: str, allocation: Allocation) -> str | None:
        """Replace what `pod_key` holds by `allocation`, with the same CPU and memory; None on success, else
        why it was refused, and then nothing changed (the old grant is taken back)."""
        held = self.held.get(pod_key)
        if held is None:
            return f"pod {pod_key} holds nothing"
        pod = PodRequest(pod_key, held.cpu_milli, held.memory_mib)
        self.release(pod_key)
        refused = self.allocate(pod, allocation)
        if refused is not None:
            self.allocate(pod, held.allocation)
        return refused

    def gpu_at(self, node: str, index: int) -> GPU | None:
        """GPU `index` of node `node`, None when either is unknown."""
        i = self.index.get(node)
        return None if i is None else next((g for g in self.nodes[i].gpus if g.index == index), None)

    def node_copy(self, i: int) -> ClusterState:
        """Node `i` alone, as a state of its own holding what its pods hold here (their keys kept): a
        what-if changes the copy, never this state. O(one node), however large the cluster."""
        node = self.nodes[i]
        out = ClusterState([node])
        w = out.width
        out.max_sharers = self.max_sharers
        out.cpu_free[0], out.mem_free[0] = self.cpu_free[i], self.mem_free[i]
        # Health may have changed since the node was built (set_gpu_health): the row, not the Node, is truth.
        out.gpu_healthy[0] = self.gpu_healthy[i, :w]
        out.gpu_milli_free[0] = self.gpu_milli_free[i, :w]
        out.gpu_mem_free[0] = self.gpu_mem_free[i, :w]
        out.gpu_sharers[0] = self.gpu_sharers[i, :w]
        out.held = {key: Held(self.held[key].allocation, 0, self.held[key].cpu_milli, self.held[key].memory_mib)
                    for key in self.node_pods[i]}
        out.node_pods[0] = set(self.node_pods[i])
        return out

    def copy(self) -> ClusterState:
        """An independent copy: what changes with allocate, release and set_gpu_health is copied, the rest
        (nodes, totals, models: never changed after construction) is shared."""
        out = copy.copy(self)
        for name in ("cpu_free", "mem_free", "gpu_healthy", "gpu_milli_free", "gpu_mem_free", "gpu_sharers",
                     "node_version"):
            setattr(out, name, getattr(self, name).copy())
        out.held = dict(self.held)  # Held is frozen: sharing the values is safe
        out.node_pods = [set(p) for p in self.node_pods]
        return out

    def set_gpu_health(self, node: str, index: int, healthy: bool) -> None:
        i = self.index[node]
        self.gpu_healthy[i, index] = healthy
        self.node_version[i] += 1
        self.version += 1

    # --- summaries ------------------------------------------------------------------------------------

    def allocated_milli(self) -> int:
        """Compute share handed out, in milli-GPU (a half-used GPU counts 500)."""
        return int((MILLI_PER_GPU * self.gpu_present - self.gpu_milli_free).sum())

    def grants_for(self, node_index: int, pod: PodRequest, gpu_indices: Iterable[int]) -> tuple[GPUGrant, ...]:
        node = self.nodes[node_index]
        return tuple(
            GPUGrant(
                uuid=node.gpus[j].uuid,
                index=j,
                milli=min(pod.gpu.milli, MILLI_PER_GPU),
                memory_mib=pod.gpu.memory_on(node.gpus[j].memory_mib),
            )
            for j in gpu_indices
        )
