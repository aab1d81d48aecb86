"""Background defragmentation: moves of movable shares that leave whole GPUs free, chosen by the
fragmentation they remove per GiB moved.

`plan_moves` (gpupool.core.moves) makes room for one pending pod, and only once it fits nowhere: by then the
free compute sits in holes smaller than any share that would have to leave, and no plan exists
(docs/simulate.md, "Moves"). The defragmenter acts ahead of need: while the cluster still has holes large
enough to take whole shares, it empties GPUs by moving their shares into holes on GPUs that stay in use.

**What one round plans** (`plan_defrag`). A source is a usable GPU in use whose every holder is movable.
Emptying it moves each of its shares, largest first, to the GPU where it fits (by the placement rules,
`core/fit.check`) that is left with the least free compute, then memory, among the usable GPUs that are in
use and *fuller* than the source (more compute used; equal use: later in the sources' order). Fuller-only
targets make the round a consolidation: a share never moves to an idle GPU (that would only move the hole).
A GPU that received a share in the round is not emptied in it, so no share moves twice. A source whose shares
do not all find a target is left as it was. `off_node`: a moved share goes to another node than the one it
leaves (a remote share: one GPU server serves a claim's share on one GPU). `usable`: only these GPUs are
sources or targets (the scheduler: GPUs with a GPU server).

**Which sources first: fragmentation removed per GiB moved.** Each source is first tried alone on the state
as it is. Without a `measure`, every GPU emptied removes the same fragmented free compute (its own free part
and the holes its shares fill: one GPU's worth), so the order is by the cost alone, the GPU memory its shares
hold (what the moves copy), then moves, compute used, the node's rank and the GPU index. With a `measure` (the
typical workload, gpupool.core.frag), the gain is the drop in FGD fragmentation of the nodes it touches; only
sources with a positive gain are kept, best gain per GiB first. They are then carried out in that order, each
tried again on the state the earlier ones left (and kept only if its gain is still positive).

**Budget.** At most `max_moves` moves and `max_mib` MiB moved per round; a source that would go over is
skipped and cheaper ones are still tried. At most `MAX_SOURCES` sources are tried per round.

**When.** `fragmentation` is the share of the free GPU compute that is not on a whole free GPU; the caller
runs a round when it passes its threshold (the simulator every `interval` pods, the scheduler's leader every
`interval_s`). Pure: no I/O; the simulator (gpupool.sim.replay) and the scheduler
(gpupool.scheduler.defrag) call the same functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gpupool.core.fit import check
from gpupool.core.frag import WorkloadArrays, cluster_fragmentation, table_fragmentation, usable_free
from gpupool.core.model import MILLI_PER_GPU, Allocation, PodRequest
from gpupool.core.moves import MIB_PER_GIB, MovableShares, Move, _Share
from gpupool.core.state import BoolArray, ClusterState, IntArray

MAX_SOURCES = 256  # GPUs tried per round


@dataclass(frozen=True, slots=True)
class DefragPlan:
    """One round: the moves in order, the GPUs they leave empty ((node name, GPU index)), memory moved."""

    moves: tuple[Move, ...]
    freed: tuple[tuple[str, int], ...]
    memory_mib: int

    @property
    def gib(self) -> float:
        return self.memory_mib / MIB_PER_GIB


def fragmentation(state: ClusterState, usable: BoolArray | None = None) -> float:
    """The share (0 to 1) of the free compute of healthy (and `usable`) GPUs that is not on a whole free GPU;
    0 when nothing is free."""
    ok = state.gpu_present & state.gpu_healthy
    if usable is not None:
        ok = ok & usable
    free = state.gpu_milli_free[ok]
    total = int(free.sum())
    if total == 0:
        return 0.0
    whole = int(free[(free >= MILLI_PER_GPU) & (state.gpu_sharers[ok] == 0)].sum())
    return (total - whole) / total


def plan_defrag(
    state: ClusterState,
    movable: Mapping[str, PodRequest] | MovableShares,
    max_moves: int,
    max_mib: int | None = None,
    rank: IntArray | None = None,
    usable: BoolArray | None = None,
    off_node: bool = False,
    measure: WorkloadArrays | None = None,
) -> DefragPlan:
    """The moves of one round within the budget (see the module doc); empty when nothing can be emptied.
    `state` is not changed."""
    if max_moves < 0 or (max_mib is not None and max_mib < 0):
        raise ValueError("max_moves and max_mib must not be negative")
    index = movable if isinstance(movable, MovableShares) else MovableShares(state, movable)
    order = np.arange(len(state), dtype=np.int64) if rank is None else np.asarray(rank, dtype=np.int64)
    ok = state.gpu_present & state.gpu_healthy
    if usable is not None:
        ok = ok & usable
    used = MILLI_PER_GPU - state.gpu_milli_free
    # The first filter: a source's largest share must fit the hole of some fuller GPU in use, and the fullest
    # GPUs have the smallest holes, so the largest hole among GPUs using at least u is at most 1000 - (the
    # least use >= u among the others).
    in_use = np.sort(used[ok & (state.gpu_sharers > 0)])
    whole = ok & (index.count > 0) & (index.count == state.gpu_sharers) & (index.count <= max_moves)
    rows, cols = np.nonzero(whole)  # a holder that cannot move keeps the GPU in use
    k = np.searchsorted(in_use, used[rows, cols], side="left") + ok[rows, cols]  # past itself when counted
    hole = MILLI_PER_GPU - np.append(in_use, MILLI_PER_GPU)[np.minimum(k, len(in_use))]
    keep = index.largest[rows, cols] <= hole
    sources: list[tuple[tuple[int, int, int, int, int], tuple[int, int]]] = []
    for i, j in zip(rows[keep].tolist(), cols[keep].tolist(), strict=True):
        sources.append(((int(index.memory[i, j]), int(index.count[i, j]), int(used[i, j]), int(order[i]), j),
                        (i, j)))
    sources.sort()
    # A GPU's place in the sources' order (-1: not a source); targets must come later or be fuller.
    position = np.full(state.gpu_milli_free.shape, -1, dtype=np.int64)
    for p, (_, at) in enumerate(sources):
        position[at] = p

    work = state.copy()
    frag = cluster_fragmentation(work, measure) if measure is not None else None

    def attempt(p: int, i: int, j: int, src_used: int) -> tuple[list[tuple[_Share, Allocation]],
                                                                  list[tuple[int, int]], float] | None:
        """Empty GPU (i, j) of `work`; what moved (for `_undo`), the targets, and the fragmentation removed
        (1.0 without a measure); None when it cannot be emptied (work as it was)."""
        shares = sorted(index.by_gpu[(i, j)], key=lambda s: (-s.milli, -s.memory_mib, s.key))
        done = _empty(work, shares, ok & ~emptied, position, p, src_used, i, j, off_node, order)
        if done is None:
            return None
        placed, targets = done
        if frag is None or measure is None:
            return placed, targets, 1.0
        nodes = np.unique(np.asarray([i] + [t for t, _ in targets], dtype=np.int64))
        after = table_fragmentation(usable_free(work, nodes), work.cpu_free[nodes], measure.model_ok[nodes], measure)
        return placed, targets, float(frag[nodes].sum() - after.sum())

    emptied = np.zeros_like(ok)
    # Each source on the state as it is, alone: its gain, then sources by gain per GiB (best first).
    ranked: list[tuple[float, int, int, int, int, int]] = []
    for p, ((mem, count, src_used, _, _), (i, j)) in enumerate(sources[:MAX_SOURCES]):
        if count > max_moves or (max_mib is not None and mem > max_mib):
            continue
        tried = attempt(p, i, j, src_used)
        if tried is None:
            continue
        _undo(work, tried[0])
        if tried[2] > 0:
            ranked.append((-tried[2] / max(mem, 1), p, i, j, src_used, mem))
    ranked.sort()
    moves: list[Move] = []
    freed: list[tuple[str, int]] = []
    memory = 0
    received = np.zeros_like(ok)  # GPUs this round moved a share to: never emptied in the same round
    for _, p, i, j, src_used, mem in ranked:
        if received[i, j]:
            continue
        if len(moves) + len(index.by_gpu[(i, j)]) > max_moves or (max_mib is not None and memory + mem > max_mib):
            continue
        tried = attempt(p, i, j, src_used)  # again: earlier sources of the round changed the state
        if tried is None:
            continue
        placed, targets, gain = tried
        if gain <= 0:
            _undo(work, placed)
            continue
        if frag is not None and measure is not None:
            nodes = np.unique(np.asarray([i] + [t for t, _ in targets], dtype=np.int64))
            frag[nodes] = table_fragmentation(usable_free(work, nodes), work.cpu_free[nodes],
                                              measure.model_ok[nodes], measure)
        emptied[i, j] = True
        for ti, tj in targets:
            received[ti, tj] = True
        for (s, _), (ti, tj) in zip(placed, targets, strict=True):
            moves.append(Move(s.key, (state.nodes[i].name, j), (state.nodes[ti].name, tj), s.memory_mib,
                              work.held[s.key].allocation))
        freed.append((state.nodes[i].name, j))
        memory += mem
    return DefragPlan(tuple(moves), tuple(freed), memory)


def _undo(work: ClusterState, placed: list[tuple[_Share, Allocation]]) -> None:
    """Put moved shares back where they were (latest first)."""
    for share, before in reversed(placed):
        work.release(share.key)
        work.allocate(share.request, before)


def _empty(work: ClusterState, shares: list[_Share], ok: BoolArray, position: IntArray, p: int, src_used: int,
           i: int, j: int, off_node: bool, order: IntArray
           ) -> tuple[list[tuple[_Share, Allocation]], list[tuple[int, int]]] | None:
    """Move every share off GPU (i, j) of `work` to fuller GPUs, best fit: what moved (each share with where it
    was) and the targets, or None (and `work` as it was)."""
    placed: list[tuple[_Share, Allocation]] = []
    targets: list[tuple[int, int]] = []
    for s in shares:
        before = work.release(s.key)
        assert before is not None
        fit = check(work, s.request)
        mask = fit.gpu_fit & (fit.code == 0)[:, None]
        rows = fit.nodes
        used = MILLI_PER_GPU - work.gpu_milli_free[rows]
        pos = position[rows]
        fuller = (used > src_used) | ((used == src_used) & ((pos > p) | (pos < 0)))
        mask &= ok[rows] & (work.gpu_sharers[rows] > 0) & fuller
        mask[rows == i, j] = False
        if off_node:
            mask[rows == i, :] = False
        r, c = np.nonzero(mask)
        if not len(r):
            work.allocate(s.request, before)
            _undo(work, placed)
            return None
        n = rows[r]
        k = np.lexsort((c, order[n], work.gpu_mem_free[n, c], work.gpu_milli_free[n, c]))[0]
        ti, tj = int(n[k]), int(c[k])
        alloc = Allocation(s.key, work.nodes[ti].name, work.grants_for(ti, s.request, (tj,)), before.policy)
        refused = work.allocate(s.request, alloc)
        if refused is not None:  # check() said it fits: a disagreement is a bug
            raise RuntimeError(f"defrag move of {s.key}: {refused}")
        placed.append((s, before))
        targets.append((ti, tj))
    return placed, targets


def apply_defrag(state: ClusterState, plan: DefragPlan) -> str | None:
    """Carry out the round's moves in order through the state's own release and allocate. None on success,
    else why one was refused; then nothing has changed."""
    done: list[tuple[PodRequest, Allocation]] = []
    for m in plan.moves:
        held = state.held.get(m.key)
        refused = f"share {m.key} holds nothing" if held is None else None
        if held is not None:
            pod = PodRequest(m.key, held.cpu_milli, held.memory_mib)
            state.release(m.key)
            refused = state.allocate(pod, m.allocation)
            if refused is None:
                done.append((pod, held.allocation))
                continue
            state.allocate(pod, held.allocation)
            refused = f"move of {m.key}: {refused}"
        for pod, before in reversed(done):
            state.release(pod.key)
            state.allocate(pod, before)
        return refused
    return None
