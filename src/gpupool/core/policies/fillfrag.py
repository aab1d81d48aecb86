"""Fill fragmentation: FGD's measure, looking past the next pod.

FGD (gpupool.core.frag) asks of each typical task m: could *one* m be placed here? A node with three free
GPUs and 20 free cores is no fragment for a 1-GPU, 11-core task, yet after one such pod two GPUs are
stranded for want of CPU; a GPU with 530 milli free is no fragment for a 470 task, yet 60 milli stay idle
once it is there. *Fill fragmentation* asks instead: fill the node with as many copies of m as its GPUs
and its CPU allow; how much idle GPU compute is left? For a one-GPU task of s milli and c cores on a
node with per-GPU free f_j and free CPU C:

    copies = min(sum_j floor(f_j / s), floor(C / c)),   fragment = sum_j f_j - copies * s

(all idle compute when m needs no GPU or the node's model is excluded, as in FGD). Tasks that take
several GPUs keep FGD's fragment. The fill measure is always at least FGD's.

The score blends the two, (1 - BLEND) * FGD + BLEND * fill, and then follows FGD exactly: the node score
is the artifact's integer sigmoid of the decrease, ties go to the fixed node order, a share takes the
first GPU reaching the best score. A small blend matters: the fill measure alone, or a large share of it,
did worse than FGD on the traces (docs/placement.md), because it no longer makes the ties that keep
placements together. Values are cached per pod shape and node version, as FGD's are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from gpupool.core.frag import DEFAULT_WORKLOAD, WorkloadArrays, usable_free
from gpupool.core.model import PodRequest
from gpupool.core.policies.fgd import sigmoid_score
from gpupool.core.policy import FloatArray, PolicyContext
from gpupool.core.state import BoolArray, ClusterState, IntArray

# Share of the fill measure in the blend; measured on seeds 42-51 of the three bundled traces
# (docs/placement.md, "What we tried").
BLEND = 0.07
_NO_CPU_LIMIT = np.iinfo(np.int64).max // 4  # copies allowed by CPU when a task asks for no CPU


def fill_fragmentation(
    free: npt.NDArray[np.int64], cpu_free: IntArray, model_ok: BoolArray, w: WorkloadArrays, blend: float = BLEND
) -> FloatArray:
    """Blended expected fragment (milli-GPU) of K nodes: (1 - blend) * FGD's + blend * fill. `free` is
    [K, G] (or [K, C, G] with `cpu_free` and `model_ok` broadcastable to the leading dims)."""
    f = free[..., :, None]  # [..., G, 1]
    fits = f >= w.milli  # [..., G, M]
    total = free.sum(axis=-1)[..., None]  # [..., 1]
    small = np.where(fits, 0, f).sum(axis=-2)  # FGD: idle compute on GPUs too small for the task
    cpu = cpu_free[..., None]
    hosts = model_ok & (w.milli > 0)
    fgd = np.where(hosts & (cpu >= w.cpu) & (fits.sum(axis=-2) >= w.count), small, total)
    per_gpu = (f // np.maximum(w.milli, 1)).sum(axis=-2)  # copies the GPUs take
    by_cpu = np.where(w.cpu > 0, cpu // np.maximum(w.cpu, 1), _NO_CPU_LIMIT)  # copies the CPU takes
    fill = np.where(hosts, total - np.minimum(per_gpu, by_cpu) * w.milli, total)
    per_task = np.where(w.count > 1, fgd, (1.0 - blend) * fgd + blend * fill)
    result: FloatArray = per_task @ w.weight
    return result


@dataclass(slots=True)
class _ShapeScores:
    score: FloatArray
    gpu: IntArray  # best GPU index for a share, -1 otherwise
    version: IntArray


@dataclass(slots=True)
class FillCache:
    """Per-cluster cache: each node's current blended fragment, and scores per pod shape."""

    state: ClusterState
    workload: WorkloadArrays
    frag: FloatArray
    frag_version: IntArray
    shapes: dict[Any, _ShapeScores] = field(default_factory=dict)

    @staticmethod
    def of(state: ClusterState, ctx: PolicyContext) -> FillCache:
        cache = ctx.cache.get("fill")
        if not isinstance(cache, FillCache) or cache.state is not state:
            n = len(state)
            cache = FillCache(
                state=state,
                workload=WorkloadArrays.build(state, ctx.workload or DEFAULT_WORKLOAD),
                frag=np.zeros(n),
                frag_version=np.full(n, -1, dtype=np.int64),
            )
            ctx.cache["fill"] = cache
        return cache

    def current(self, nodes: IntArray) -> FloatArray:
        st = self.state
        stale = nodes[self.frag_version[nodes] != st.node_version[nodes]]
        if len(stale):
            self.frag[stale] = fill_fragmentation(
                usable_free(st, stale), st.cpu_free[stale], self.workload.model_ok[stale], self.workload
            )
            self.frag_version[stale] = st.node_version[stale]
        result: FloatArray = self.frag[nodes]
        return result


def _after_share(cache: FillCache, pod: PodRequest, nodes: IntArray) -> FloatArray:
    """Blended fragment after the share goes to GPU c of each node: [K, C] (meaningful where it fits)."""
    st = cache.state
    free = usable_free(st, nodes)
    eye = np.eye(free.shape[1], dtype=np.int64) * pod.gpu.milli
    after = np.maximum(free[:, None, :] - eye[None, :, :], 0)  # [K, C, G]
    cpu_after = (st.cpu_free[nodes] - pod.cpu_milli)[:, None]
    return fill_fragmentation(after, cpu_after, cache.workload.model_ok[nodes][:, None, :], cache.workload)


def _after_whole(cache: FillCache, pod: PodRequest, nodes: IntArray, gpu_fit: BoolArray) -> FloatArray:
    """Blended fragment after the pod takes the first `count` fitting GPUs (device order) and its CPU."""
    st = cache.state
    free = usable_free(st, nodes)
    if pod.gpu.count:
        taken = gpu_fit & (np.cumsum(gpu_fit, axis=1) <= pod.gpu.count)
        free = np.where(taken, free - pod.gpu.milli, free)
    cpu_after = st.cpu_free[nodes] - pod.cpu_milli
    return fill_fragmentation(free, cpu_after, cache.workload.model_ok[nodes], cache.workload)


def fill_delta(
    state: ClusterState, pod: PodRequest, nodes: IntArray, gpu_fit: BoolArray, ctx: PolicyContext
) -> tuple[FloatArray, IntArray]:
    """Per node: the integer sigmoid score of the decrease in blended fragment for the best GPU choice,
    and that GPU (first reaching the best score; -1 for whole GPUs or none). Higher is better."""
    cache = FillCache.of(state, ctx)
    key = (pod.cpu_milli, pod.gpu)
    sc = cache.shapes.get(key)
    if sc is None:
        n = len(state)
        sc = _ShapeScores(np.zeros(n), np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64))
        cache.shapes[key] = sc
    stale_pos = np.flatnonzero(sc.version[nodes] != state.node_version[nodes])
    if len(stale_pos):
        stale = nodes[stale_pos]
        before = cache.current(stale)
        fit = gpu_fit[stale_pos]
        if pod.gpu.count == 1 and not pod.gpu.whole:
            after = _after_share(cache, pod, stale)
            value = np.where(fit, sigmoid_score(np.where(fit, before[:, None] - after, 0.0)), -1.0)
            best = np.argmax(value, axis=1)  # ties go to the lower GPU index
            sc.score[stale] = value[np.arange(len(stale)), best]
            sc.gpu[stale] = best
        else:
            sc.score[stale] = sigmoid_score(before - _after_whole(cache, pod, stale, fit))
        sc.version[stale] = state.node_version[stale]
    return sc.score[nodes], sc.gpu[nodes]
