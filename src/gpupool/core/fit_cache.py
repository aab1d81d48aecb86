"""Feasibility and node-local scores kept per pod shape, recomputed only for the nodes that changed.

A placement changes one node, and a trace has a few dozen distinct pod shapes, so a replay that asks
`check` and a policy's score about every node for every pod repeats almost all of its work. These caches
give exactly the same answers (the same row-by-row functions, applied to the stale rows only), keyed on
`ClusterState.node_version`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpupool.core.fit import gpu_rows
from gpupool.core.model import GPURequest, PodRequest
from gpupool.core.policy import FloatArray, Policy, PolicyContext
from gpupool.core.state import BoolArray, ClusterState, IntArray


@dataclass(slots=True)
class _GpuRows:
    ok: BoolArray  # [N]: the node passes the GPU checks
    gpu_fit: BoolArray  # [N, G]
    version: IntArray  # [N]: node version the row was computed at (-1: never)


class FitCache:
    """`check(state, pod)` reduced to what a placement needs: the feasible nodes and their GPU rows.
    The GPU part is cached per GPU request; CPU and memory are two comparisons over all nodes."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._rows: dict[GPURequest, _GpuRows] = {}

    def gpu_rows(self, gpu: GPURequest) -> tuple[BoolArray, BoolArray]:
        """For every node: whether it passes the GPU checks for `gpu`, and which GPU slots take it.
        The arrays are the cache's own: read, never write."""
        st = self.state
        rows = self._rows.get(gpu)
        if rows is None:
            n = len(st)
            rows = _GpuRows(np.zeros(n, dtype=bool), np.zeros((n, st.width), dtype=bool),
                            np.full(n, -1, dtype=np.int64))
            self._rows[gpu] = rows
        stale = np.flatnonzero(rows.version != st.node_version)
        if len(stale):
            fit, code = gpu_rows(st, gpu, stale)
            rows.gpu_fit[stale] = fit
            rows.ok[stale] = code == 0
            rows.version[stale] = st.node_version[stale]
        return rows.ok, rows.gpu_fit

    def feasible(self, pod: PodRequest) -> tuple[IntArray, BoolArray]:
        """The nodes where `check` says OK, and their GPU rows."""
        st = self.state
        if pod.problems():
            return np.zeros(0, dtype=np.int64), np.zeros((0, st.width), dtype=bool)
        gpu_ok, gpu_fit = self.gpu_rows(pod.gpu)
        feasible = np.flatnonzero(gpu_ok & (st.mem_free >= pod.memory_mib) & (st.cpu_free >= pod.cpu_milli))
        return feasible, gpu_fit[feasible]


@dataclass(slots=True)
class _Scores:
    score: FloatArray
    version: IntArray


def is_node_local(policy: Policy) -> bool:
    """Whether the policy says a node's score depends on that node and the pod only (not on the other
    candidates, not on a random draw), so that it may be cached per node version."""
    return bool(getattr(policy, "node_local", False))


class LocalScores:
    """A node-local policy's scores per pod shape, recomputed for changed feasible nodes only."""

    def __init__(self, state: ClusterState, policy: Policy, ctx: PolicyContext) -> None:
        self.state, self.policy, self.ctx = state, policy, ctx
        self._shapes: dict[Any, _Scores] = {}

    def scores(self, pod: PodRequest, feasible: IntArray, gpu_fit: BoolArray) -> FloatArray:
        st = self.state
        key = (pod.cpu_milli, pod.memory_mib, pod.gpu)
        sc = self._shapes.get(key)
        if sc is None:
            sc = _Scores(np.zeros(len(st)), np.full(len(st), -1, dtype=np.int64))
            self._shapes[key] = sc
        pos = np.flatnonzero(sc.version[feasible] != st.node_version[feasible])
        if len(pos):
            nodes = feasible[pos]
            sc.score[nodes] = self.policy.score(st, pod, nodes, gpu_fit[pos], self.ctx)
            sc.version[nodes] = st.node_version[nodes]
        result: FloatArray = sc.score[feasible]
        return result
