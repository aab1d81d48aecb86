"""Fragmentation Gradient Descent (Weng et al., ATC '23): place a pod where the node's expected
fragmentation (gpupool.core.frag) grows least.

Scores are cached per pod shape and per node, keyed on `ClusterState.node_version`: a placement changes
one node, so a pod of a shape seen recently needs only the nodes changed since then to be re-scored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from gpupool.core.frag import (
    DEFAULT_WORKLOAD,
    WorkloadArrays,
    node_fragmentation,
    share_fragmentation,
    table_fragmentation,
    usable_free,
)
from gpupool.core.model import PodRequest
from gpupool.core.policy import FloatArray, PolicyContext
from gpupool.core.state import BoolArray, ClusterState, IntArray

MAX_NODE_SCORE = 100


@dataclass(slots=True)
class _ShapeCache:
    score: FloatArray
    gpu: IntArray  # best GPU index for a share, -1 otherwise
    version: IntArray


@dataclass(slots=True)
class FragCache:
    """Per-cluster derived data of the FGD policy."""

    state: ClusterState
    workload: WorkloadArrays
    frag: FloatArray
    frag_version: IntArray
    shapes: dict[Any, _ShapeCache] = field(default_factory=dict)

    @staticmethod
    def of(state: ClusterState, ctx: PolicyContext) -> FragCache:
        cache = ctx.cache.get("fgd")
        if not isinstance(cache, FragCache) or cache.state is not state:
            n = len(state)
            cache = FragCache(
                state=state,
                workload=WorkloadArrays.build(state, ctx.workload or DEFAULT_WORKLOAD),
                frag=np.zeros(n),
                frag_version=np.full(n, -1, dtype=np.int64),
            )
            ctx.cache["fgd"] = cache
        return cache

    def current(self, nodes: IntArray) -> FloatArray:
        """Expected fragmentation of `nodes` now, recomputing only nodes that changed."""
        st = self.state
        stale = nodes[self.frag_version[nodes] != st.node_version[nodes]]
        if len(stale):
            self.frag[stale] = table_fragmentation(
                usable_free(st, stale), st.cpu_free[stale], self.workload.model_ok[stale], self.workload
            )
            self.frag_version[stale] = st.node_version[stale]
        result: FloatArray = self.frag[nodes]
        return result


def is_share(pod: PodRequest) -> bool:
    """A pod taking part of one GPU: it has a candidate per fitting GPU; other pods have one per node."""
    return pod.gpu.count == 1 and not pod.gpu.whole


def after_pod(
    state: ClusterState, pod: PodRequest, nodes: IntArray, gpu_fit: BoolArray
) -> tuple[npt.NDArray[np.int64], IntArray]:
    """Free compute per GPU and free CPU of each node once the pod is there. A share: [K, C, G] and
    [K, 1], candidate c taking the share from GPU c (where it does not fit, the result is meaningless);
    otherwise [K, G] and [K], the pod taking the first `count` fitting GPUs in device order."""
    free = usable_free(state, nodes)
    cpu_after = state.cpu_free[nodes] - pod.cpu_milli
    if is_share(pod):
        eye = np.eye(free.shape[1], dtype=np.int64) * pod.gpu.milli
        return np.maximum(free[:, None, :] - eye[None, :, :], 0), cpu_after[:, None]
    if pod.gpu.count:
        taken = gpu_fit & (np.cumsum(gpu_fit, axis=1) <= pod.gpu.count)
        free = np.where(taken, free - pod.gpu.milli, free)
    return free, cpu_after


def _fragmentation_after(cache: FragCache, pod: PodRequest, nodes: IntArray, gpu_fit: BoolArray) -> FloatArray:
    """Fragmentation after the pod: [K, G] for a share (inf where it does not fit), else [K]."""
    model_ok = cache.workload.model_ok[nodes]
    if not is_share(pod):
        free, cpu_after = after_pod(cache.state, pod, nodes, gpu_fit)
        return node_fragmentation(free, cpu_after, model_ok, cache.workload)
    st = cache.state
    frag = share_fragmentation(usable_free(st, nodes), st.cpu_free[nodes] - pod.cpu_milli, model_ok,
                               pod.gpu.milli, cache.workload)
    result: FloatArray = np.where(gpu_fit, frag, np.inf)
    return result


def fragmentation_delta(
    state: ClusterState,
    pod: PodRequest,
    nodes: IntArray,
    gpu_fit: BoolArray,
    ctx: PolicyContext,
) -> tuple[FloatArray, IntArray]:
    """For each node: FGD's integer score of the decrease in fragmentation for the best GPU choice, and
    that GPU (the first reaching the best score; -1 when the pod takes whole GPUs or none). Higher is
    better. Cached per shape and node version. (Exact, unrounded decreases were measured worse: the
    rounding creates ties that the fixed node order turns into consolidation; docs/placement.md.)"""
    cache = FragCache.of(state, ctx)
    key = (pod.cpu_milli, pod.gpu)
    sc = cache.shapes.get(key)
    if sc is None:
        n = len(state)
        sc = _ShapeCache(np.zeros(n), np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64))
        cache.shapes[key] = sc
    stale_pos = np.flatnonzero(sc.version[nodes] != state.node_version[nodes])
    if len(stale_pos):
        stale = nodes[stale_pos]
        before = cache.current(stale)
        fit = gpu_fit[stale_pos]
        after = _fragmentation_after(cache, pod, stale, fit)
        if is_share(pod):
            value = np.where(fit, sigmoid_score(np.where(fit, before[:, None] - after, 0.0)), -1.0)
            best = np.argmax(value, axis=1)  # ties go to the lower GPU index
            sc.score[stale] = value[np.arange(len(stale)), best]
            sc.gpu[stale] = best
        else:
            sc.score[stale] = sigmoid_score(before - after)
        sc.version[stale] = state.node_version[stale]
    return sc.score[nodes], sc.gpu[nodes]


def sigmoid_score(delta: FloatArray) -> FloatArray:
    """The artifact's node score: 100·sigmoid(Δ/1000) truncated to an integer."""
    result: FloatArray = np.floor(MAX_NODE_SCORE / (1.0 + np.exp(-delta / 1000.0)))
    return result


@dataclass(frozen=True, slots=True)
class FGD:
    name: str = "fgd"
    node_local: ClassVar[bool] = True  # a node's score depends on it and the pod only

    def score(
        self, state: ClusterState, pod: PodRequest, nodes: IntArray, gpu_fit: BoolArray, ctx: PolicyContext
    ) -> FloatArray:
        score, _ = fragmentation_delta(state, pod, nodes, gpu_fit, ctx)
        return score

    def choose(
        self, state: ClusterState, pod: PodRequest, node: int, gpu_fit: BoolArray, ctx: PolicyContext
    ) -> tuple[int, ...]:
        return choose_by_fragmentation(state, pod, node, gpu_fit, ctx)


def choose_by_fragmentation(
    state: ClusterState,
    pod: PodRequest,
    node: int,
    gpu_fit: BoolArray,
    ctx: PolicyContext,
) -> tuple[int, ...]:
    """The GPU whose use grows fragmentation least (a share), or the first free GPUs (whole GPUs)."""
    nodes = np.array([node], dtype=np.int64)
    _, gpu = fragmentation_delta(state, pod, nodes, gpu_fit[None, :], ctx)
    if gpu[0] >= 0:
        return (int(gpu[0]),)
    return tuple(int(j) for j in np.flatnonzero(gpu_fit)[: pod.gpu.count])
