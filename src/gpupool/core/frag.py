"""GPU fragmentation with respect to an expected workload (the measure of FGD, Weng et al. ATC '23).

For one node and one typical task m, the node's idle GPU compute is a *fragment* for m when m cannot
use it: all of it when m needs no GPU, when m's model constraint excludes the node, when the node cannot
host m's GPUs or CPU; otherwise only the idle compute of GPUs that individually have less free than m's
per-GPU request. A node's fragmentation is the popularity-weighted sum over the typical tasks. Memory
plays no part in this measure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpupool.core.model import MILLI_PER_GPU, PodRequest
from gpupool.core.policy import FloatArray, TaskShape
from gpupool.core.state import BoolArray, ClusterState, IntArray

# How the FGD artifact picks typical tasks: the most popular shapes, taken 10 at a time, until they
# cover at least 95 % of the pods; popularities are then renormalised to sum to 1.
POPULARITY_THRESHOLD = 0.95
SHAPE_STEP = 10


# Used when nothing is known about the workload (a scheduler that has not seen pods yet): whole GPUs,
# halves and quarters, equally likely.
DEFAULT_WORKLOAD = (
    TaskShape(cpu_milli=0, gpu_milli=1000, gpu_count=1, weight=1 / 3),
    TaskShape(cpu_milli=0, gpu_milli=500, gpu_count=1, weight=1 / 3),
    TaskShape(cpu_milli=0, gpu_milli=250, gpu_count=1, weight=1 / 3),
)


def shape_of(pod: PodRequest) -> tuple[int, int, int, frozenset[str]]:
    g = pod.gpu
    return (pod.cpu_milli, g.milli if g.count else 0, g.count, g.models)


def typical_workload(pods: Iterable[PodRequest]) -> tuple[TaskShape, ...]:
    counts = Counter(shape_of(p) for p in pods)
    total = sum(counts.values())
    if total == 0:
        return ()
    # Most popular first; equal counts in a fixed order so that runs are reproducible.
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0][0], kv[0][1], kv[0][2], sorted(kv[0][3])))
    taken = 0
    covered = 0
    while covered < POPULARITY_THRESHOLD * total and taken < len(ordered):
        step_end = min(taken + SHAPE_STEP, len(ordered))
        covered += sum(n for _, n in ordered[taken:step_end])
        taken = step_end
    chosen = ordered[:taken]
    return tuple(
        TaskShape(cpu_milli=c, gpu_milli=m, gpu_count=k, models=models, weight=n / covered)
        for (c, m, k, models), n in chosen
    )


@dataclass(frozen=True, slots=True)
class WorkloadArrays:
    """The typical tasks as column vectors, plus which nodes each task may use (model constraint)."""

    cpu: IntArray  # [M]
    milli: IntArray  # [M]
    count: IntArray  # [M]
    weight: FloatArray  # [M]
    model_ok: BoolArray  # [N, M]
    # Per free value v = 0..1000 and task m: whether a GPU with v free takes m's share, and the idle
    # compute it leaves as a fragment for m (v if it does not take it). Sums of these over a node's GPUs
    # are the counts and fragments of `node_fragmentation`, and change by one GPU's row when a share lands.
    fit_table: IntArray  # [1001, M]
    small_table: IntArray  # [1001, M]

    @staticmethod
    def build(state: ClusterState, workload: tuple[TaskShape, ...]) -> WorkloadArrays:
        node_model = state.gpu_model[:, 0]
        ok = np.ones((len(state), len(workload)), dtype=bool)
        for j, t in enumerate(workload):
            if t.models:
                ok[:, j] = np.isin(node_model, [state.model_id(m) for m in t.models])
        milli = np.array([t.gpu_milli for t in workload], dtype=np.int64)
        values = np.arange(MILLI_PER_GPU + 1, dtype=np.int64)[:, None]
        fits = values >= milli[None, :]
        return WorkloadArrays(
            cpu=np.array([t.cpu_milli for t in workload], dtype=np.int64),
            milli=milli,
            count=np.array([t.gpu_count for t in workload], dtype=np.int64),
            weight=np.array([t.weight for t in workload], dtype=np.float64),
            model_ok=ok,
            fit_table=fits.astype(np.int64),
            small_table=np.where(fits, 0, values),
        )


def usable_free(state: ClusterState, nodes: IntArray) -> IntArray:
    """Free compute per GPU slot, zero for absent or unhealthy GPUs (they can host nothing)."""
    ok = state.gpu_present[nodes] & state.gpu_healthy[nodes]
    result: IntArray = np.where(ok, state.gpu_milli_free[nodes], 0)
    return result


def node_fragmentation(
    free: npt.NDArray[np.int64], cpu_free: IntArray, model_ok: BoolArray, w: WorkloadArrays
) -> FloatArray:
    """Expected fragment (milli-GPU) of K nodes. `free` is [K, G] (or [K, C, G] with `cpu_free` and
    `model_ok` broadcastable to the leading dims)."""
    f = free[..., :, None]  # [..., G, 1]
    fits = f >= w.milli  # [..., G, M]
    cnt = fits.sum(axis=-2)  # [..., M]
    small = np.where(fits, 0, f).sum(axis=-2)  # idle compute on GPUs too small for the task
    total = free.sum(axis=-1)[..., None]  # [..., 1]
    host = model_ok & (cpu_free[..., None] >= w.cpu) & (cnt >= w.count) & (w.milli > 0)
    frag = np.where(host, small, total)
    result: FloatArray = frag @ w.weight
    return result


def _fragment(cnt: IntArray, small: IntArray, total: IntArray, cpu_free: IntArray, model_ok: BoolArray,
              w: WorkloadArrays) -> FloatArray:
    host = model_ok & (cpu_free[..., None] >= w.cpu) & (cnt >= w.count) & (w.milli > 0)
    frag = np.where(host, small, total)
    result: FloatArray = frag @ w.weight
    return result


def table_fragmentation(free: IntArray, cpu_free: IntArray, model_ok: BoolArray, w: WorkloadArrays) -> FloatArray:
    """`node_fragmentation` of K nodes ([K, G] free, each 0..1000) through the workload's tables."""
    cnt = w.fit_table[free].sum(axis=-2)
    small = w.small_table[free].sum(axis=-2)
    return _fragment(cnt, small, free.sum(axis=-1)[..., None], cpu_free, model_ok, w)


def share_fragmentation(free: IntArray, cpu_after: IntArray, model_ok: BoolArray, milli: int,
                        w: WorkloadArrays) -> FloatArray:
    """[K, G]: the fragmentation of each of K nodes once a share of `milli` takes GPU c (column c; where
    it does not fit the free compute floors at 0, as `after_pod` does). Equal to `node_fragmentation` of
    those K x G after-states, but each candidate changes one GPU's row of the node's sums, not all G."""
    fit_before, small_before = w.fit_table[free], w.small_table[free]  # [K, G, M]
    after = np.maximum(free - milli, 0)
    cnt = fit_before.sum(axis=1)[:, None, :] - fit_before + w.fit_table[after]
    small = small_before.sum(axis=1)[:, None, :] - small_before + w.small_table[after]
    total = (free.sum(axis=1)[:, None] - free + after)[..., None]
    return _fragment(cnt, small, total, cpu_after[:, None], model_ok[:, None, :], w)


def cluster_fragmentation(state: ClusterState, w: WorkloadArrays) -> FloatArray:
    """Per-node expected fragment for every node of the cluster."""
    nodes = np.arange(len(state), dtype=np.int64)
    return node_fragmentation(usable_free(state, nodes), state.cpu_free, w.model_ok, w)
