"""One replay of a pod list on a cluster with one policy and one seed (the FGD artifact's protocol).

Protocol: pods sorted by name, shuffled with the seed, topped up by sampling with replacement (or
trimmed at random) to `tune` × the cluster's GPU capacity; submitted one at a time; a pod that fits
nowhere is dropped; nothing departs. Ties between equally scored nodes go to a seed-dependent node order.

With `moves` > 0, a pod that fits nowhere is given to the move planner (gpupool.core.moves) before it is
dropped: the cheapest plan of at most `moves` moves of movable shares after which it fits is carried out
through the state's own release and allocate, and the pod is placed where the plan says. Movable: every
placed one-GPU share below a whole GPU, or a seeded `movable` fraction of them (by a hash of seed and key).

With `defrag` (a DefragPolicy), the background defragmenter runs on the same movable shares: after every
`interval`-th submitted pod, when the cluster's fragmentation is above the threshold, one round of
gpupool.core.defrag.plan_defrag (GPUs emptied into fuller ones, within the round's budget) is carried out; its
moves are counted on that pod, and the log follows every moved share to its new GPU.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.core.defrag import apply_defrag, fragmentation, plan_defrag
from gpupool.core.fit_cache import FitCache
from gpupool.core.frag import (
    WorkloadArrays,
    cluster_fragmentation,
    table_fragmentation,
    typical_workload,
    usable_free,
)
from gpupool.core.model import MILLI_PER_GPU, Node, PodRequest
from gpupool.core.moves import MIB_PER_GIB, MovableShares, apply_plan, plan_moves
from gpupool.core.policies import get_policy
from gpupool.core.policy import PolicyContext
from gpupool.core.state import ClusterState
from gpupool.sim.engine import Placer

TUNE = 1.3


@dataclass(frozen=True, slots=True)
class DefragPolicy:
    """The replay's background defragmenter: every `interval` submitted pods, when the cluster's fragmentation
    (gpupool.core.defrag.fragmentation, 0 to 1) is above `threshold`, one round of at most `max_moves` moves
    and `max_gib` GiB moved (None: no limit on memory)."""

    interval: int = 50
    threshold: float = 0.5
    max_moves: int = 16
    max_gib: float | None = None
    # Empty a GPU only when that lowers the cluster's fragmentation for the typical workload (gpupool.core.frag),
    # sources taken by fragmentation removed per GiB; False: every GPU that can be emptied, cheapest first.
    by_fragmentation: bool = True

    def __post_init__(self) -> None:
        if self.interval < 1 or self.max_moves < 0 or not 0 <= self.threshold <= 1 or \
                (self.max_gib is not None and self.max_gib < 0):
            raise ValueError(f"defragmenter: interval {self.interval} (>= 1), threshold {self.threshold} (0 to 1), "
                             f"max_moves {self.max_moves} and max_gib {self.max_gib} (>= 0) expected")


@dataclass(frozen=True, slots=True)
class ReplayLog:
    """Per submitted pod, after its decision: milli-GPU allocated, arrived, fragmented, idle."""

    allocated: np.ndarray
    arrived: np.ndarray
    fragmented: np.ndarray
    capacity_milli: int
    failed: int
    seconds: float
    # Per submitted pod: the node index it went to (-1: failed) and its GPUs as a bit set (GPU j = 1 << j).
    node: np.ndarray | None = None
    gpus: np.ndarray | None = None
    # With moves allowed: per submitted pod, the moves made to place it and the GPU memory (MiB) they moved
    # (0 for every pod placed without moves, or when moves are off).
    moves: np.ndarray | None = None
    moved_mib: np.ndarray | None = None
    move_cost: float = 0.0

    def moves_until(self, arrived_pct: int) -> tuple[int, float]:
        """Moves made, and GiB moved, for the pods submitted until arrived demand reaches `arrived_pct` %."""
        if self.moves is None or self.moved_mib is None:
            return 0, 0.0
        sel = self.arrived <= arrived_pct / 100.0 * self.capacity_milli
        return int(self.moves[sel].sum()), float(self.moved_mib[sel].sum()) / 1024.0

    def curve(self) -> list[tuple[int, float]]:
        """Mean allocated % per integer bucket of arrived % (the artifact's post-processing)."""
        x = np.round(100.0 * self.arrived / self.capacity_milli).astype(np.int64)
        y = 100.0 * self.allocated / self.capacity_milli
        out = []
        for bucket in np.unique(x):
            out.append((int(bucket), float(y[x == bucket].mean())))
        return out

    def allocated_at(self, arrived_pct: int) -> float:
        """Allocated % at an arrived bucket; the nearest lower bucket if that one is empty."""
        points = [(x, y) for x, y in self.curve() if x <= arrived_pct]
        return points[-1][1] if points else 0.0

    def frag_pct_at(self, arrived_pct: int) -> float:
        x = np.round(100.0 * self.arrived / self.capacity_milli).astype(np.int64)
        sel = x == arrived_pct
        return float(100.0 * self.fragmented[sel].mean() / self.capacity_milli) if sel.any() else float("nan")


def workload_for(pods: Sequence[PodRequest], capacity_milli: int, rng: np.random.Generator,
                 tune: float = TUNE) -> list[PodRequest]:
    """Shuffle, then inflate (sampling with replacement) or deflate to `tune` × capacity."""
    ordered = sorted(pods, key=lambda p: p.key)
    order = rng.permutation(len(ordered))
    out = [ordered[i] for i in order]
    target = tune * capacity_milli
    demand = [p.gpu.total_milli for p in out]
    total = sum(demand)
    if total < target:
        k = 0
        while True:
            pick = ordered[int(rng.integers(len(ordered)))]
            milli = pick.gpu.milli if pick.gpu.count else 0
            if total + milli > target:  # as the artifact: the test looks at the per-GPU share only
                break
            k += 1
            out.append(PodRequest(key=f"{pick.key}-topup{k}", cpu_milli=pick.cpu_milli,
                                  memory_mib=pick.memory_mib, gpu=pick.gpu))
            total += pick.gpu.count * milli
    elif total > target:
        keep = np.ones(len(out), dtype=bool)
        for i in rng.permutation(len(out)):
            if total <= target:
                break
            keep[i] = False
            total -= demand[i]
        out = [p for p, k in zip(out, keep, strict=True) if k]
    return out


@dataclass(slots=True)
class ReplaySetup:
    """A replay's starting point for one seed: the empty cluster, the submitted pods in order, and the
    context the policy sees (its tie-break rank and typical workload)."""

    state: ClusterState
    submitted: list[PodRequest]
    ctx: PolicyContext

    @property
    def capacity_milli(self) -> int:
        return self.state.total_gpus * MILLI_PER_GPU


def setup(nodes: Sequence[Node], pods: Sequence[PodRequest], seed: int, tune: float = TUNE) -> ReplaySetup:
    """The protocol's seeded draws, in their order (pod order, then node rank), shared by `replay` and by
    the benchmarks that drive their own loop over the same pods."""
    state = ClusterState(nodes)
    rng = np.random.default_rng(seed)
    submitted = workload_for(pods, state.total_gpus * MILLI_PER_GPU, rng, tune)
    ctx = PolicyContext(rng=np.random.default_rng(seed + 1), workload=typical_workload(pods),
                        rank=rng.permutation(len(state)).astype(np.int64))
    return ReplaySetup(state, submitted, ctx)


def replay(
    nodes: Sequence[Node],
    pods: Sequence[PodRequest],
    policy_name: str,
    seed: int,
    tune: float = TUNE,
    progress: Callable[[int, int], None] | None = None,
    max_sharers: int = 0,
    moves: int = 0,
    move_cost_per_gib: float = 1.0,
    movable: float = 1.0,
    defrag: DefragPolicy | None = None,
) -> ReplayLog:
    """One policy, one seed, FGD's protocol. `max_sharers` > 0 holds each GPU to that many pods. `moves` > 0
    lets a pod that fits nowhere be placed after at most that many moves of movable shares (a `movable`
    fraction of the placed one-GPU shares), the cheapest by `move_cost_per_gib` (module docstring). `defrag`
    runs the background defragmenter (gpupool.core.defrag) on the same movable shares."""
    start = time.perf_counter()
    policy = get_policy(policy_name)
    run = setup(nodes, pods, seed, tune)
    state, submitted, ctx, capacity = run.state, run.submitted, run.ctx, run.capacity_milli
    state.max_sharers = max_sharers
    measure = WorkloadArrays.build(state, ctx.workload)
    frag = cluster_fragmentation(state, measure)
    n = len(submitted)
    allocated = np.zeros(n)
    arrived = np.zeros(n)
    fragmented = np.zeros(n)
    placed_node = np.full(n, -1, dtype=np.int64)
    placed_gpus = np.zeros(n, dtype=np.int64)
    arrived_total = 0
    failed = 0
    placer = Placer(state, policy, ctx)
    allocated_total = state.allocated_milli()
    mover = _Mover(state, moves, move_cost_per_gib, movable, seed, policy.name, ctx.rank, n, placer.fit, defrag,
                   measure) \
        if moves or defrag is not None else None
    for k, pod in enumerate(submitted):
        arrived_total += pod.gpu.total_milli
        choice = placer.decide(pod)
        if choice is not None:
            allocated_total += placer.take(pod, choice)
            placed_node[k] = choice.node
            placed_gpus[k] = sum(1 << j for j in choice.gpus)
            if mover is not None:
                mover.placed(pod, k)
            # Only the chosen node changed: refresh its share of the cluster's fragmentation.
            i = np.array([choice.node], dtype=np.int64)
            frag[i] = table_fragmentation(usable_free(state, i), state.cpu_free[i], measure.model_ok[i], measure)
        elif mover is not None and mover.max_moves and (touched := mover.place(pod, k)) is not None:
            allocated_total += pod.gpu.total_milli
            for position, (node, gpus) in touched.items():
                placed_node[position], placed_gpus[position] = node, gpus
            # The request's node (where every moved share came from) and the moves' targets changed.
            i = np.unique(np.asarray([node for node, _ in touched.values()], dtype=np.int64))
            frag[i] = table_fragmentation(usable_free(state, i), state.cpu_free[i], measure.model_ok[i], measure)
        else:
            failed += 1
        if mover is not None and (touched := mover.defragment(k)):
            for position, (node, gpus) in touched.items():
                placed_node[position], placed_gpus[position] = node, gpus
            i = np.unique(np.asarray([node for node, _ in touched.values()] + mover.sources, dtype=np.int64))
            frag[i] = table_fragmentation(usable_free(state, i), state.cpu_free[i], measure.model_ok[i], measure)
        allocated[k] = allocated_total
        arrived[k] = arrived_total
        fragmented[k] = frag.sum()
        if progress is not None:
            progress(k + 1, n)
    if mover is not None:
        return ReplayLog(allocated, arrived, fragmented, capacity, failed, time.perf_counter() - start,
                         placed_node, placed_gpus, mover.moves_per_pod, mover.mib_per_pod, mover.cost)
    return ReplayLog(allocated, arrived, fragmented, capacity, failed, time.perf_counter() - start,
                     placed_node, placed_gpus)


class _Mover:
    """The replay's side of moves: which placed shares may move, the planner's calls, and what moved."""

    def __init__(self, state: ClusterState, max_moves: int, cost_per_gib: float, fraction: float, seed: int,
                 policy: str, rank: np.ndarray | None, pods: int, fit: FitCache,
                 defrag: DefragPolicy | None = None, measure: WorkloadArrays | None = None) -> None:
        self.state, self.max_moves, self.cost_per_gib = state, max_moves, cost_per_gib
        self.defrag = defrag
        self.measure = measure if defrag is not None and defrag.by_fragmentation else None
        self.sources: list[int] = []  # node indices the last defragmentation round moved shares off
        self.rounds = 0  # defragmentation rounds that moved something
        self.fraction, self.seed, self.policy, self.rank, self.fit = fraction, seed, policy, rank, fit
        self.movable = MovableShares(state)
        self.index: dict[str, int] = {}  # pod key -> position in the submitted list
        self.failed_at: dict[tuple[int, int, object], int] = {}  # pod shape -> state version it found no plan
        self.moves_per_pod = np.zeros(pods, dtype=np.int64)
        self.mib_per_pod = np.zeros(pods, dtype=np.int64)
        self.cost = 0.0

    def is_movable(self, pod: PodRequest) -> bool:
        if pod.gpu.count != 1 or pod.gpu.milli >= MILLI_PER_GPU:
            return False
        if self.fraction >= 1.0:
            return True
        return zlib.crc32(f"{self.seed}:{pod.key}".encode()) < self.fraction * 2**32

    def placed(self, pod: PodRequest, k: int) -> None:
        self.index[pod.key] = k
        if self.is_movable(pod):
            self.movable.add(pod.key, pod)

    def place(self, pod: PodRequest, k: int) -> dict[int, tuple[int, int]] | None:
        """Try to place `pod` (submitted position k) after moves. On success: node index and GPU bit set of
        it and of every share it moved, by submitted position."""
        shape = (pod.cpu_milli, pod.memory_mib, pod.gpu)
        if self.failed_at.get(shape) == self.state.version:
            return None  # nothing changed since this shape last found no plan
        plan = plan_moves(self.state, pod, self.movable, self.max_moves, self.cost_per_gib, rank=self.rank,
                          policy=self.policy, fit_cache=self.fit)
        if plan is None:
            self.failed_at[shape] = self.state.version
            return None
        refused = apply_plan(self.state, plan, pod)
        if refused is not None:  # the planner's plan must apply: fail loudly
            raise RuntimeError(f"move plan for {pod.key} refused: {refused}")
        self.movable.moved(plan)
        self.placed(pod, k)
        self.moves_per_pod[k] = len(plan.moves)
        self.mib_per_pod[k] = plan.memory_mib
        self.cost += plan.cost
        out = {}
        for key in [pod.key, *(m.key for m in plan.moves)]:
            held = self.state.held[key]
            out[self.index[key]] = (held.node_index, sum(1 << g.index for g in held.allocation.grants))
        return out

    def defragment(self, k: int) -> dict[int, tuple[int, int]]:
        """After submitted pod k: a defragmentation round when one is due (every `interval` pods, the
        fragmentation above the threshold). The moved shares' node index and GPU bit set, by submitted
        position (empty: nothing moved); their moves are counted on pod k."""
        d = self.defrag
        self.sources = []
        if d is None or (k + 1) % d.interval or fragmentation(self.state) <= d.threshold:
            return {}
        plan = plan_defrag(self.state, self.movable, d.max_moves,
                           None if d.max_gib is None else int(d.max_gib * MIB_PER_GIB), rank=self.rank,
                           measure=self.measure)
        if not plan.moves:
            return {}
        refused = apply_defrag(self.state, plan)
        if refused is not None:  # the planner's round must apply: fail loudly
            raise RuntimeError(f"defragmentation round after pod {k} refused: {refused}")
        self.movable.follow(plan.moves)
        self.rounds += 1
        self.moves_per_pod[k] += len(plan.moves)
        self.mib_per_pod[k] += plan.memory_mib
        self.cost += self.cost_per_gib * plan.gib
        self.sources = [self.state.index[m.source[0]] for m in plan.moves]
        out = {}
        for m in plan.moves:
            held = self.state.held[m.key]
            out[self.index[m.key]] = (held.node_index, sum(1 << g.index for g in held.allocation.grants))
        return out
