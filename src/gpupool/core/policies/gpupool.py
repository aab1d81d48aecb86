"""gpupool's default policy: FGD's placement, steered away from the waste FGD cannot see.

For a pod, each feasible node and candidate GPU (a share: every fitting GPU; otherwise the first fitting
GPUs) gets two decreases: dF of FGD's expected fragment (gpupool.core.frag) and dV of the node's waste
(gpupool.core.policies.waste: pairing slack and GPUs stranded for want of CPU). The score is FGD's
integer sigmoid of

    dF + GAMMA · (dV - the best dV over the pod's candidates)

Ties go to the node order and a share takes the first GPU reaching its node's best score, as in FGD.
Centring dV on its best candidate keeps the sigmoid out of saturation when a pod adds the same waste
everywhere (a cluster short of CPU), where it would otherwise score every node alike. Multi-GPU pods:
the set of fitting GPUs with the most NVLink links, then the fewest NUMA nodes, then the lowest indices
(the trace has no topology). With no observed workload, both measures use whole, half and quarter GPUs.

Every answer is a function of the cluster state, the pod and the context's workload only: the best dV is
taken over every node where the pod fits (gpupool.core.fit), not over the nodes of the call, so a node's
score does not depend on which other nodes were asked about, and `choose` needs no memory of an earlier
`score` (the caches below are memos keyed on node and cluster versions).
On the bundled traces this leaves fewer GPUs unallocated than FGD on every seed of all three
(docs/placement.md, where GAMMA was chosen).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpupool.core.fit_cache import FitCache
from gpupool.core.frag import (
    DEFAULT_WORKLOAD,
    WorkloadArrays,
    node_fragmentation,
    share_fragmentation,
    table_fragmentation,
    usable_free,
)
from gpupool.core.model import PodRequest
from gpupool.core.policies.fgd import after_pod, is_share, sigmoid_score
from gpupool.core.policies.model_pressure import confined_demand, node_pressure, pressure
from gpupool.core.policies.waste import feed_ratio, node_waste, pairing_table, share_waste
from gpupool.core.policy import FloatArray, PolicyContext, TaskShape
from gpupool.core.state import BoolArray, ClusterState, IntArray

GAMMA = 6.0  # weight of the waste decrease against FGD's; chosen on seeds 42-45 (docs/placement.md)
# Weight of the model-pool pressure (model_pressure.py), per milli-GPU the pod takes; 0 on traces where no
# pod names a model. Chosen on the constrained variants (docs/placement.md).
LAMBDA = 1.0


def linked_gpus(state: ClusterState, node: int, candidates: list[int], count: int) -> tuple[int, ...]:
    """Greedy: from each start GPU, add the candidate with most NVLink links to the chosen set (ties:
    same NUMA node, then lower index); keep the set with the most links, then fewest NUMA nodes."""
    gpus = state.nodes[node].gpus
    best: tuple[int, int, tuple[int, ...]] | None = None
    for start in candidates:
        chosen = [start]
        while len(chosen) < count:
            rest = [c for c in candidates if c not in chosen]
            links = [sum(c in gpus[x].nvlink_peers for x in chosen) for c in rest]
            same_numa = [sum(gpus[c].numa_node == gpus[x].numa_node for x in chosen) for c in rest]
            pick = max(range(len(rest)), key=lambda r: (links[r], same_numa[r], -rest[r]))
            chosen.append(rest[pick])
        total_links = sum(b in gpus[a].nvlink_peers for a in chosen for b in chosen if a < b)
        numa = len({gpus[c].numa_node for c in chosen})
        key = (total_links, -numa, tuple(sorted(chosen)))
        if best is None or (key[0], key[1]) > (best[0], best[1]):
            best = key
    return best[2] if best else ()


@dataclass(slots=True)
class _Deltas:
    """Per pod shape: decreases per node and candidate GPU (column 0 only, for pods not sharing a GPU)."""

    value: FloatArray  # [N, G]: dF + GAMMA * dV (the score is its sigmoid, less GAMMA * the best dV)
    waste: FloatArray  # [N, G]: dV
    ok: BoolArray  # [N, G]: a real candidate
    version: IntArray  # [N]: node version the row was computed at
    # Per node, over its candidates: the largest dV and the largest value. The score is monotone in the
    # value, so a node's best score needs one sigmoid per node, not one per GPU.
    top_waste: FloatArray  # [N]
    top: FloatArray  # [N]


@dataclass(slots=True)
class _Cache:
    state: ClusterState
    source: tuple[TaskShape, ...]  # the context's workload these arrays were built from
    workload: WorkloadArrays
    pairing: FloatArray
    feed: FloatArray | None
    fit: FitCache
    confined: FloatArray  # per model: the share of demand only that model serves
    shapes: dict[Any, _Deltas] = field(default_factory=dict)
    # Best dV and least model pressure per pod shape, and the pressure per model, at `centres_version`
    # of the cluster (memos: cleared when the cluster changes).
    centres: dict[Any, tuple[float, float]] = field(default_factory=dict)
    centres_version: int = -1
    pressures: FloatArray | None = None

    @staticmethod
    def of(state: ClusterState, ctx: PolicyContext) -> _Cache:
        cache = ctx.cache.get("gpupool")
        if (not isinstance(cache, _Cache) or cache.state is not state
                or (cache.source is not ctx.workload and cache.source != ctx.workload)):
            w = WorkloadArrays.build(state, ctx.workload or DEFAULT_WORKLOAD)
            cache = _Cache(state, ctx.workload, w, pairing_table(w), feed_ratio(state, w), FitCache(state),
                           confined_demand(state, w))
            ctx.cache["gpupool"] = cache
        return cache

    def _fresh(self) -> FloatArray:
        st = self.state
        if self.centres_version != st.version or self.pressures is None:
            self.centres.clear()
            self.centres_version = st.version
            self.pressures = pressure(st, self.confined)
        return self.pressures

    def centre(self, pod: PodRequest) -> tuple[float, float]:
        """Over every node where the pod fits now: the best dV and the least pressure of the node's model
        (0, 0 when it fits nowhere)."""
        per_model = self._fresh()
        key = (pod.cpu_milli, pod.memory_mib, pod.gpu)
        best = self.centres.get(key)
        if best is None:
            feasible, _ = self.fit.feasible(pod)
            top_waste = self.deltas(pod, feasible).top_waste[feasible]
            waste = float(top_waste.max()) if len(feasible) and np.isfinite(top_waste.max()) else 0.0
            least = float(node_pressure(self.state, per_model, feasible).min()) if len(feasible) else 0.0
            best = self.centres[key] = (waste, least)
        return best

    def offset(self, pod: PodRequest, nodes: IntArray) -> FloatArray:
        """What each node's value loses before the sigmoid: GAMMA · the pod's best dV (centring), and the
        pressure of the node's model above the least the pod could find, per milli-GPU it takes."""
        best_waste, least = self.centre(pod)
        assert self.pressures is not None  # set by centre
        extra = node_pressure(self.state, self.pressures, nodes) - least
        result: FloatArray = GAMMA * best_waste + LAMBDA * pod.gpu.total_milli * extra
        return result

    def deltas(self, pod: PodRequest, nodes: IntArray) -> _Deltas:
        """dF + GAMMA * dV, dV and the candidate mask for `nodes`, recomputing only nodes changed since this shape's
        last look (a placement changes one node). Candidates are the GPUs that take the pod's request
        (gpupool.core.fit), whatever a caller narrows them to later."""
        st, w = self.state, self.workload
        d = self.shapes.get((pod.cpu_milli, pod.gpu))
        if d is None:
            shape = (len(st), st.width)
            d = _Deltas(np.zeros(shape), np.zeros(shape), np.zeros(shape, dtype=bool),
                        np.full(len(st), -1, dtype=np.int64), np.zeros(len(st)), np.zeros(len(st)))
            self.shapes[(pod.cpu_milli, pod.gpu)] = d
        pos = np.flatnonzero(d.version[nodes] != st.node_version[nodes])
        if len(pos):
            stale = nodes[pos]
            fit = self.fit.gpu_rows(pod.gpu)[1][stale]
            free, cpu, model_ok = usable_free(st, stale), st.cpu_free[stale], w.model_ok[stale]
            feed = None if self.feed is None else self.feed[stale]
            frag0, waste0 = table_fragmentation(free, cpu, model_ok, w), node_waste(free, cpu, self.pairing, feed)
            if is_share(pod):
                cpu1 = cpu - pod.cpu_milli
                frag = frag0[:, None] - share_fragmentation(free, cpu1, model_ok, pod.gpu.milli, w)
                d.waste[stale] = waste0[:, None] - share_waste(
                    free, cpu1, pod.gpu.milli, self.pairing, None if feed is None else feed[:, None])
                d.value[stale] = frag + GAMMA * d.waste[stale]
                d.ok[stale] = fit
            else:
                after, cpu1 = after_pod(st, pod, stale, fit)
                d.value[stale], d.waste[stale], d.ok[stale] = 0.0, 0.0, False
                d.waste[stale, 0] = waste0 - node_waste(after, cpu1, self.pairing, feed)
                d.value[stale, 0] = frag0 - node_fragmentation(after, cpu1, model_ok, w) + GAMMA * d.waste[stale, 0]
                d.ok[stale, 0] = True
            d.version[stale] = st.node_version[stale]
            ok = d.ok[stale]
            d.top_waste[stale] = np.where(ok, d.waste[stale], -np.inf).max(axis=1)
            d.top[stale] = np.where(ok, d.value[stale], -np.inf).max(axis=1)
        return d

    def scores(self, pod: PodRequest, nodes: IntArray, gpu_fit: BoolArray) -> FloatArray:
        """Each node's best integer score over the candidates `gpu_fit` leaves (a share), centred on the
        pod's best dV."""
        d = self.deltas(pod, nodes)
        offset = self.offset(pod, nodes)
        top = d.top[nodes]
        if is_share(pod):
            narrowed = (gpu_fit != d.ok[nodes]).any(axis=1)
            if narrowed.any():  # a caller left fewer GPUs than fit: the best over those only
                rows = nodes[narrowed]
                top = top.copy()
                top[narrowed] = np.where(gpu_fit[narrowed] & d.ok[rows], d.value[rows], -np.inf).max(axis=1)
        score: FloatArray = np.where(np.isfinite(top), sigmoid_score(top - offset), -1.0)
        return score

    def gpu_on(self, pod: PodRequest, node: int, gpu_fit: BoolArray) -> int:
        """The first GPU of `node` left by `gpu_fit` reaching its best integer score (a share)."""
        one = np.array([node], dtype=np.int64)
        d = self.deltas(pod, one)
        ok = d.ok[node] & gpu_fit
        score = np.where(ok, sigmoid_score(d.value[node] - self.offset(pod, one)[0]), -1.0)
        return int(np.argmax(score))


@dataclass(frozen=True, slots=True)
class GpupoolPolicy:
    name: str = "gpupool"

    def score(
        self, state: ClusterState, pod: PodRequest, nodes: IntArray, gpu_fit: BoolArray, ctx: PolicyContext
    ) -> FloatArray:
        return _Cache.of(state, ctx).scores(pod, nodes, gpu_fit)

    def choose(
        self, state: ClusterState, pod: PodRequest, node: int, gpu_fit: BoolArray, ctx: PolicyContext
    ) -> tuple[int, ...]:
        fitting = [int(j) for j in np.flatnonzero(gpu_fit)]
        if pod.gpu.count > 1:
            return linked_gpus(state, node, fitting, pod.gpu.count)
        if not is_share(pod):
            return tuple(fitting[: pod.gpu.count])
        return (_Cache.of(state, ctx).gpu_on(pod, node, gpu_fit),)
