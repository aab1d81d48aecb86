"""Making room by moving shares: the cheapest plan of at most N moves after which a pod fits.

A pod that fits nowhere may fit once a few single-GPU shares move to other GPUs. `plan_moves` finds the
cheapest such plan; `apply_plan` carries it out on a `ClusterState` through its own `release` and
`allocate`. Pure: no I/O, no Kubernetes; the scheduler (its remote shares are the movable ones) and the
simulator (`gpupool simulate --moves`) call the same functions.

**What a plan is.** The request lands on a set G of GPUs of one node (one GPU for a share or a one-GPU pod,
k GPUs of one node for a k-GPU pod). Each move takes one movable share that sits on a GPU of G and gives it
one GPU outside G where it fits, by the same rules as placement (`core/fit.check`: healthy, allowed model
and UUIDs, free compute and memory, the node's CPU and memory, `max_sharers`). Moves run in order; a moved
share keeps its key, its compute and its CPU and memory (they go with it to the target node), and its GPU
memory on the target is what its request asks on that card. Not in a plan: moves that only make room for
other moves (chains), moves off GPUs outside G, and moves that free CPU or memory on the request's node
(the node must already have the request's CPU and memory: a remote share's CPU is on its client's node,
not on the GPU server it is moved from).

**Cost.** Memory moved is the GPU memory the moved shares hold at their source (what a move copies). Plans
are ranked by (memory moved, number of moves) when `cost_per_gib` > 0, by (moves, memory) when it is 0;
`plan.cost` = `cost_per_gib` × GiB moved, and `max_cost` (when given) refuses dearer plans. Ties between
equally cheap plans go to the node of lowest `rank` (the policy context's tie-break order), then the lowest
GPU index.

**Search** (bounded):
1. Shares that cannot move: a movable share whose request fits no GPU but its own (GPU rules, and the CPU and
   memory of some node; its own node's counted as free) is left out at once.
2. Candidates, filtered on per-GPU sums kept in `MovableShares`: for a one-GPU request every allowed GPU of a
   node with the request's CPU and memory free, whose card is large enough and whose movable shares hold at
   least what it lacks in compute, memory and sharer slots; for a k-GPU request every node where the free
   GPUs plus the GPUs whose holders are all movable (at most N) reach k, using every free GPU and choosing the
   rest among the others with at most N shares in all.
3. Best first: candidates sit in a heap under a lower bound of their cost (the memory deficit, at least the
   smallest movable share's memory, and one move), ties by node rank and GPU index. A popped candidate lists
   its feasible subsets (every subset of at most N of its shares that frees enough, cheapest first) and is
   pushed back under its cheapest one; a popped subset is tried: its shares are released on a copy of the
   state and given targets, tightest first (least compute, then memory, left on the target), backtracking
   when two shares want the same room. The first subset that can be placed is the answer: everything still
   in the heap costs at least as much.
4. Bounds: at most `MAX_ATTEMPTS` subsets tried and `MAX_STEPS` target choices per call; past them the search
   gives up (None). On small clusters they are never reached and the plan is the cheapest of the plan space
   above: tests/core/test_moves.py checks it against a brute-force enumeration.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.core.fit import _allowed_gpus, check, gpu_rows
from gpupool.core.fit_cache import FitCache
from gpupool.core.model import MILLI_PER_GPU, Allocation, GPURequest, PodRequest
from gpupool.core.state import BoolArray, ClusterState, IntArray

MAX_ATTEMPTS = 64  # subsets tried per call (each a relocation of its shares)
MAX_STEPS = 512  # target choices per call, over all attempts (backtracking included)
MIB_PER_GIB = 1024


@dataclass(frozen=True, slots=True)
class Move:
    """One share moved: from GPU `source` to GPU `target`, each (node name, GPU index)."""

    key: str
    source: tuple[str, int]
    target: tuple[str, int]
    memory_mib: int  # GPU memory the share holds at its source: what the move copies
    allocation: Allocation  # what the share holds after the move


@dataclass(frozen=True, slots=True)
class MovePlan:
    moves: tuple[Move, ...]
    allocation: Allocation  # the request's, valid once every move is done
    memory_mib: int  # total GPU memory moved
    cost: float  # cost_per_gib × GiB moved

    @property
    def gib(self) -> float:
        return self.memory_mib / MIB_PER_GIB


@dataclass(frozen=True, slots=True)
class _Share:
    key: str
    request: PodRequest  # with the CPU and memory it holds now (they travel with it)
    node: int
    gpu: int
    milli: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class _Option:
    """One way to make room: the request on `gpus` (of the candidate's node) once `shares` have moved."""

    key: tuple[int, int]
    gpus: tuple[int, ...]
    shares: tuple[_Share, ...]


@dataclass(slots=True)
class _Search:
    state: ClusterState
    request: PodRequest
    by_gpu: dict[tuple[int, int], list[_Share]]
    placeable: Callable[[_Share], bool]
    max_moves: int
    by_memory: bool
    rank: IntArray
    work: ClusterState | None = None
    attempts: int = 0
    steps: int = 0

    def key(self, memory: int, moves: int) -> tuple[int, int]:
        return (memory, moves) if self.by_memory else (moves, memory)

    def copy(self) -> ClusterState:
        if self.work is None:
            self.work = self.state.copy()
        return self.work


class MovableShares:
    """The movable shares of a state, per GPU, with per-GPU sums for the search's first filter. `plan_moves`
    builds one from a mapping; a caller that plans often (the simulator) keeps one up to date instead: `add`
    when a movable share is placed, `moved` after `apply_plan`, `discard` when it leaves."""

    def __init__(self, state: ClusterState, movable: Mapping[str, PodRequest] | None = None) -> None:
        self.state = state
        self.by_gpu: dict[tuple[int, int], list[_Share]] = {}
        self.where: dict[str, tuple[int, int]] = {}
        self.requests: dict[str, PodRequest] = {}
        shape = (len(state), state.width)
        self.count = np.zeros(shape, dtype=np.int64)
        self.milli = np.zeros(shape, dtype=np.int64)
        self.memory = np.zeros(shape, dtype=np.int64)
        self.smallest = np.full(shape, np.iinfo(np.int64).max, dtype=np.int64)
        self.largest = np.zeros(shape, dtype=np.int64)  # the compute (milli) of the largest share
        for key, req in (movable or {}).items():
            self.add(key, req)

    def add(self, key: str, request: PodRequest) -> None:
        """`key` (held in the state, on one GPU) may move; anything else is ignored."""
        held = self.state.held.get(key)
        if held is None or len(held.allocation.grants) != 1 or request.gpu.count != 1 or key in self.where:
            return
        g = held.allocation.grants[0]
        share = _Share(key, PodRequest(key, held.cpu_milli, held.memory_mib, request.gpu, request.policy),
                       held.node_index, g.index, g.milli, g.memory_mib)
        at = (held.node_index, g.index)
        self.requests[key] = request
        self.where[key] = at
        shares = self.by_gpu.setdefault(at, [])
        shares.append(share)
        shares.sort(key=lambda s: s.key)
        self._sums(at)

    def discard(self, key: str) -> None:
        at = self.where.pop(key, None)
        self.requests.pop(key, None)
        if at is None:
            return
        shares = [s for s in self.by_gpu.get(at, []) if s.key != key]
        if shares:
            self.by_gpu[at] = shares
        else:
            self.by_gpu.pop(at, None)
        self._sums(at)

    def moved(self, plan: MovePlan) -> None:
        """Follow the plan's moves (carried out in the state)."""
        self.follow(plan.moves)

    def follow(self, moves: Iterable[Move]) -> None:
        """Follow moves carried out in the state (a defragmentation round's: gpupool.core.defrag)."""
        for m in moves:
            request = self.requests.get(m.key)
            self.discard(m.key)
            if request is not None:
                self.add(m.key, request)

    def _sums(self, at: tuple[int, int]) -> None:
        shares = self.by_gpu.get(at, [])
        self.count[at] = len(shares)
        self.milli[at] = sum(s.milli for s in shares)
        self.memory[at] = sum(s.memory_mib for s in shares)
        self.smallest[at] = min((s.memory_mib for s in shares), default=np.iinfo(np.int64).max)
        self.largest[at] = max((s.milli for s in shares), default=0)


def _deficit(st: ClusterState, request: PodRequest, i: int, j: int) -> tuple[int, int, int]:
    """What GPU j of node i lacks for one GPU of `request`: compute, memory, sharer slots (≤ 0: none)."""
    g = request.gpu
    need_mem = g.memory_on(int(st.gpu_mem_total[i, j])) if not g.whole else int(st.gpu_mem_total[i, j])
    milli = min(g.milli, MILLI_PER_GPU)
    slots = int(st.gpu_sharers[i, j]) + 1 - st.max_sharers if st.max_sharers else 0
    return milli - int(st.gpu_milli_free[i, j]), need_mem - int(st.gpu_mem_free[i, j]), slots


def _subsets(shares: Sequence[_Share], deficit: tuple[int, int, int], n: int, search: _Search,
             j: int) -> list[_Option]:
    """Every subset of at most n shares that covers the deficit, cheapest first."""
    d_milli, d_mem, d_slots = deficit
    out = []
    for r in range(min(n, len(shares)) + 1):
        if r < d_slots:
            continue
        for combo in itertools.combinations(shares, r):
            if sum(s.milli for s in combo) >= d_milli and sum(s.memory_mib for s in combo) >= d_mem:
                out.append(_Option(search.key(sum(s.memory_mib for s in combo), r), (j,), combo))
    out.sort(key=lambda o: (o.key, [s.key for s in o.shares]))
    return out


def _targets(work: ClusterState, share: _Share, excluded: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """GPUs where the (released) share fits in `work`, outside `excluded`, tightest first (least compute,
    then memory, left; then node and GPU index)."""
    fit = check(work, share.request)
    ok = fit.code == 0
    rows, cols = np.nonzero(fit.gpu_fit & ok[:, None])
    nodes = fit.nodes[rows]
    keep = np.array([(int(i), int(j)) not in excluded for i, j in zip(nodes, cols, strict=True)], dtype=bool) \
        if excluded and len(nodes) else np.ones(len(nodes), dtype=bool)
    nodes, cols = nodes[keep], cols[keep]
    order = np.lexsort((cols, nodes, work.gpu_mem_free[nodes, cols], work.gpu_milli_free[nodes, cols]))
    return [(int(nodes[k]), int(cols[k])) for k in order]


def _relocate(search: _Search, shares: Sequence[_Share], gpus: set[tuple[int, int]]) -> list[tuple[int, int]] | None:
    """Targets for `shares` (in their order) outside `gpus`, or None; `work` is left as it was."""
    work = search.copy()
    originals = {s.key: work.release(s.key) for s in shares}
    chosen: list[tuple[int, int]] = []

    def assign(k: int) -> bool:
        if k == len(shares):
            return True
        s = shares[k]
        for i, j in _targets(work, s, gpus):
            search.steps += 1
            if search.steps > MAX_STEPS:
                return False
            before = originals[s.key]
            alloc = Allocation(s.key, work.nodes[i].name, work.grants_for(i, s.request, (j,)),
                               before.policy if before is not None else "")
            if work.allocate(s.request, alloc) is not None:
                continue
            chosen.append((i, j))
            if assign(k + 1):
                return True
            chosen.pop()
            work.release(s.key)
        return False

    try:
        # Every share must fit somewhere with all of them gone: if one does not, no order helps.
        if all(_targets(work, s, gpus) for s in shares) and assign(0):
            return list(chosen)
        return None
    finally:
        for s in shares:
            work.release(s.key)
            before = originals[s.key]
            if before is not None:
                work.allocate(s.request, before)


def plan_moves(
    state: ClusterState,
    request: PodRequest,
    movable: Mapping[str, PodRequest] | MovableShares,
    max_moves: int,
    cost_per_gib: float = 1.0,
    max_cost: float | None = None,
    rank: IntArray | None = None,
    nodes: IntArray | None = None,
    policy: str = "",
    fit_cache: FitCache | None = None,
    off_node: bool = False,
) -> MovePlan | None:
    """The cheapest plan of at most `max_moves` moves of `movable` shares (pod key -> the request it was
    placed with; keys not held in `state`, or held on several GPUs, are ignored) after which `request` fits on
    a node of `nodes` (default all), or None. `state` is not changed. `fit_cache`, a FitCache of `state`, only
    saves work (the simulator passes its own). `off_node`: a moved share goes to another node than the one it
    leaves (a remote share: one GPU server serves a claim's share on one GPU). See the module docstring."""
    if max_moves < 0 or cost_per_gib < 0:
        raise ValueError("max_moves and cost_per_gib must not be negative")
    g = request.gpu
    if request.problems() or g.count == 0 or g.count > state.width:
        return None
    st = state
    idx = np.arange(len(st), dtype=np.int64) if nodes is None else np.asarray(nodes, dtype=np.int64)
    idx = idx[(st.cpu_free[idx] >= request.cpu_milli) & (st.mem_free[idx] >= request.memory_mib)]
    if len(idx) == 0:
        return None
    order = np.arange(len(st), dtype=np.int64) if rank is None else np.asarray(rank, dtype=np.int64)

    index = movable if isinstance(movable, MovableShares) else MovableShares(st, movable)
    rows_of: dict[GPURequest, BoolArray] = {}
    shape_ok: dict[tuple[int, int, GPURequest], bool] = {}

    def placeable(share: _Share) -> bool:
        """Could the share fit some GPU other than its own (its own node's CPU counted as free)?"""
        gpu = share.request.gpu
        fit = rows_of.get(gpu)
        if fit is None:
            fit = rows_of[gpu] = fit_cache.gpu_rows(gpu)[1] if fit_cache is not None else \
                gpu_rows(st, gpu, np.arange(len(st), dtype=np.int64))[0]
        shape = (share.request.cpu_milli, share.request.memory_mib, gpu)
        ok = shape_ok.get(shape)
        if ok is None:
            node_ok = (st.cpu_free >= shape[0]) & (st.mem_free >= shape[1])
            ok = shape_ok[shape] = bool(fit[node_ok].any())
        return ok or bool(fit[share.node].sum() - fit[share.node, share.gpu] > 0)

    search = _Search(st, request, index.by_gpu, placeable, max_moves, cost_per_gib > 0, order)
    every_gpu = range(st.width)
    allowed = _allowed_gpus(st, g, idx)
    need_mem = (st.gpu_mem_total[idx] * min(g.milli, MILLI_PER_GPU) // MILLI_PER_GPU if g.memory_mib is None
                else g.memory_mib)
    allowed &= st.gpu_mem_total[idx] >= need_mem
    # Per GPU of the candidate nodes: what it lacks, and what its movable shares could free at most.
    d_milli = min(g.milli, MILLI_PER_GPU) - st.gpu_milli_free[idx]
    d_mem = need_mem - st.gpu_mem_free[idx]
    d_slots = st.gpu_sharers[idx] + 1 - st.max_sharers if st.max_sharers else np.zeros_like(d_milli)
    count, milli, memory, smallest = (a[idx] for a in (index.count, index.milli, index.memory, index.smallest))
    fits_now = (d_milli <= 0) & (d_mem <= 0) & (d_slots <= 0)
    could = (count > 0) & (milli >= d_milli) & (memory >= d_mem) & (np.minimum(count, max_moves) >= d_slots)

    heap: list[tuple[tuple[int, int], int, int, int, int, int, list[_Option] | None]] = []
    tick = itertools.count()
    if g.count == 1:
        for k, j in zip(*np.nonzero(allowed & (fits_now | could)), strict=True):
            i, j = int(idx[k]), int(j)
            if fits_now[k, j]:
                lb = search.key(0, 0)
            else:
                lb = search.key(max(int(d_mem[k, j]), int(smallest[k, j])), max(int(d_slots[k, j]), 1))
            heap.append((lb, int(order[i]), j, next(tick), i, j, None))
        heapq.heapify(heap)
    else:
        # A GPU counts when it is free, or when every holder is movable (and at most N of them).
        whole_ok = allowed & (fits_now | (could & (count == st.gpu_sharers[idx]) & (count <= max_moves)))
        for k in np.flatnonzero(whole_ok.sum(axis=1) >= g.count):
            i = int(idx[k])
            whole = _whole_options(search, i, [int(j) for j in np.flatnonzero(whole_ok[k])], g.count)
            if whole:
                heapq.heappush(heap, (whole[0].key, int(order[i]), whole[0].gpus[0], next(tick), i, -1, whole))

    while heap and search.attempts < MAX_ATTEMPTS and search.steps <= MAX_STEPS:
        _, r, j0, _, i, j, options = heapq.heappop(heap)
        if options is None:  # a one-GPU candidate seen for the first time: list its subsets
            shares = [s for s in search.by_gpu.get((i, j), []) if search.placeable(s)]
            options = _subsets(shares, _deficit(st, request, i, j), max_moves, search, j)
            if options:
                heapq.heappush(heap, (options[0].key, r, j0, next(tick), i, j, options))
            continue
        best, rest = options[0], options[1:]
        moved = sum(s.memory_mib for s in best.shares)
        if max_cost is not None and cost_per_gib * moved / MIB_PER_GIB > max_cost:
            if search.by_memory:
                continue  # its later subsets move more memory still
        else:
            search.attempts += 1
            kept = every_gpu if off_node else best.gpus  # GPUs no moved share may go to
            targets = _relocate(search, best.shares, {(i, jj) for jj in kept}) if best.shares else []
            if targets is not None:
                return _plan(st, request, i, best, targets, cost_per_gib, policy)
        if rest:
            heapq.heappush(heap, (rest[0].key, r, j0, next(tick), i, j, rest))
    return None


def _whole_options(search: _Search, i: int, allowed: Sequence[int], count: int) -> list[_Option]:
    """For a k-GPU request on node i: every free allowed GPU, plus the cheapest other GPUs whose shares all
    move (at most N shares in all), cheapest first."""
    st, n = search.state, search.max_moves
    free: list[int] = []
    costly: list[tuple[int, tuple[_Share, ...]]] = []
    for j in allowed:
        d = _deficit(st, search.request, i, j)
        if d[0] <= 0 and d[1] <= 0 and d[2] <= 0:
            free.append(j)
            continue
        shares = tuple(search.by_gpu.get((i, j), ()))
        if not all(search.placeable(s) for s in shares):
            continue
        # Whole: every holder must go, so the GPU counts only when all of them are movable and few enough.
        if shares and len(shares) <= n and len(shares) == int(st.gpu_sharers[i, j]):
            freed_milli = sum(s.milli for s in shares)
            freed_mem = sum(s.memory_mib for s in shares)
            if freed_milli >= d[0] and freed_mem >= d[1]:
                costly.append((j, shares))
    if len(free) >= count:
        return [_Option(search.key(0, 0), tuple(free[:count]), ())]
    need = count - len(free)
    if need > n or len(costly) < need:
        return []
    out = []
    for combo in itertools.combinations(costly, need):
        shares = tuple(s for _, ss in combo for s in ss)
        if len(shares) <= n:
            gpus = tuple(sorted(free + [j for j, _ in combo]))
            out.append(_Option(search.key(sum(s.memory_mib for s in shares), len(shares)), gpus, shares))
    out.sort(key=lambda o: (o.key, o.gpus))
    return out


def _plan(st: ClusterState, request: PodRequest, i: int, option: _Option, targets: Sequence[tuple[int, int]],
          cost_per_gib: float, policy: str) -> MovePlan:
    moves = []
    for s, (ti, tj) in zip(option.shares, targets, strict=True):
        held = st.held[s.key]
        alloc = Allocation(s.key, st.nodes[ti].name, st.grants_for(ti, s.request, (tj,)), held.allocation.policy)
        moves.append(Move(s.key, (st.nodes[i].name, s.gpu), (st.nodes[ti].name, tj), s.memory_mib, alloc))
    memory = sum(m.memory_mib for m in moves)
    allocation = Allocation(request.key, st.nodes[i].name, st.grants_for(i, request, option.gpus), policy)
    return MovePlan(tuple(moves), allocation, memory, cost_per_gib * memory / MIB_PER_GIB)


def apply_plan(state: ClusterState, plan: MovePlan, request: PodRequest) -> str | None:
    """Carry out `plan` (its moves in order, then the request's allocation) through the state's own release
    and allocate. None on success, else why it was refused; then nothing has changed."""
    done: list[tuple[PodRequest, Allocation]] = []

    def undo() -> None:
        for pod, before in reversed(done):
            state.release(pod.key)
            state.allocate(pod, before)

    for m in plan.moves:
        held = state.held.get(m.key)
        if held is None:
            undo()
            return f"share {m.key} holds nothing"
        pod = PodRequest(m.key, held.cpu_milli, held.memory_mib)
        state.release(m.key)
        refused = state.allocate(pod, m.allocation)
        if refused is not None:
            state.allocate(pod, held.allocation)
            undo()
            return f"move of {m.key}: {refused}"
        done.append((pod, held.allocation))
    refused = state.allocate(request, plan.allocation)
    if refused is not None:
        undo()
        return refused
    return None
