"""How many of these nodes a workload needs: the smallest scaled copy of a node list whose timeline
replay meets a wait target (p99, a pod that never ran counting as waiting forever).

Scaling keeps the mix: the nodes are grouped by shape (CPU, memory, GPU count and model) and each group
gets its share of the total by largest remainder, whole nodes only; beyond the list's own size nodes are
copied. A size's p99 wait is the longest over the seeds replayed (each seed draws the tie-breaks between
equally scored nodes), so a size meets a target only when it does whatever the tie-breaks: at the scale
where the bundled trace waits at all (8 or 9 nodes) one early tie can decide whether a GPU is stranded for
weeks, and a planner asking "how many nodes" wants the answer that holds on every seed, not on a lucky one.
The search assumes that adding nodes never lengthens the p99 wait (true of the FIFO queue up to
tie-breaks): it doubles from one node until the target is met (at most MAX_FACTOR times the list), then
bisects to PRECISION of the answer (at least one node): the answer is the smallest size tried that
meets the target, and the next smaller size tried did not. Searches for several targets can share their
measured sizes (`cache`), so a sweep over targets replays each size once per policy (`sweep_job`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gpupool.core.model import Node
from gpupool.core.queues import QueueSpec, QueueTree
from gpupool.sim.team_queues import TeamPending, TeamQueues
from gpupool.sim.timeline import TimedPod, TimelineLog, run_timeline
from gpupool.sim.timeline_report import percentile_of_waits, wait_percentile
from gpupool.sim.wait_bound import Pools, refuted

MAX_FACTOR = 4
PRECISION = 0.01  # bisection stops when the bracket is within 1 % of its upper end (or 1 node)


def shape(node: Node) -> tuple[int, int, int, str]:
    return (node.cpu_milli, node.memory_mib, len(node.gpus), node.gpus[0].model if node.gpus else "")


def scaled_nodes(nodes: Sequence[Node], count: int) -> list[Node]:
    """`count` whole nodes with the list's mix of node shapes (largest remainder; ties to the shape
    seen first)."""
    groups: dict[tuple[int, int, int, str], list[Node]] = {}
    for n in nodes:
        groups.setdefault(shape(n), []).append(n)
    total = len(nodes)
    quotas = [count * len(g) / total for g in groups.values()]
    take = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda k: (-(quotas[k] - take[k]), k))
    for k in by_remainder[: count - sum(take)]:
        take[k] += 1
    out: list[Node] = []
    for members, k in zip(groups.values(), take, strict=True):
        for r in range(k):
            base = members[r % len(members)]
            copy = r // len(members)
            if copy:
                name = f"{base.name}-copy{copy}"
                base = replace(base, name=name, gpus=tuple(replace(g, uuid=f"{name}-gpu{g.index}") for g in base.gpus))
            out.append(base)
    return out


@dataclass(slots=True)
class CapacityAnswer:
    target_s: float
    nodes: int | None  # smallest node count found meeting the target; None: no size tried meets it
    gpus: int | None
    tried: dict[int, float] = field(default_factory=dict)  # node count -> wait p99 (s), the longest over the seeds
    # node count -> seed -> wait p99 (s), for the seeds replayed (a seed that never ends the wait stops the rest)
    by_seed: dict[int, dict[int, float]] = field(default_factory=dict)

    @property
    def best(self) -> tuple[int, float]:
        """The size with the shortest p99 wait (the smallest such)."""
        return min(self.tried.items(), key=lambda kv: (kv[1], kv[0]))


def worst_p99(nodes: Sequence[Node], pods: Sequence[TimedPod], policy: str, seeds: Sequence[int],
              by_seed: dict[int, float] | None = None) -> float:
    """The longest p99 wait over one replay per seed (recorded per seed in `by_seed`). A replay whose wait
    never ends stops the others: nothing is longer."""
    worst = 0.0
    for s in seeds:
        w = wait_percentile(run_timeline(nodes, pods, policy, s), 99)
        if by_seed is not None:
            by_seed[s] = w
        worst = max(worst, w)
        if math.isinf(worst):
            break
    return worst


def search(nodes: Sequence[Node], pods: Sequence[TimedPod], policy: str, seed: int, target_s: float,
           progress: Callable[[int, int], None] | None = None,
           p99: Callable[[list[Node]], float] | None = None,
           cache: dict[int, float] | None = None, floor: int = 0, seeds: Sequence[int] = (),
           by_seed: dict[int, dict[int, float]] | None = None) -> CapacityAnswer:
    """The smallest scaled node list whose p99 wait is at most `target_s` on every one of `seeds` (default:
    `seed` alone). With `cache` (node count -> p99 wait, filled as sizes are measured; `by_seed` beside it)
    sizes measured before are not replayed again, and the search starts from the bracket they give (the
    largest size failing the target below the smallest meeting it); the answer's `tried` is then that
    cache. Sizes up to `floor` are known to fail (a lower bound, `gpupool.sim.wait_bound`) and are not
    replayed; doubling then starts from twice that. With neither, it doubles from one node as always."""
    answer = CapacityAnswer(target_s, None, None, cache if cache is not None else {},
                            by_seed if by_seed is not None else {})

    def measure(count: int) -> float:
        scaled = scaled_nodes(nodes, count)
        if p99 is not None:
            return p99(scaled)
        return worst_p99(scaled, pods, policy, seeds or (seed,), answer.by_seed.setdefault(count, {}))

    step = 0

    def ok(count: int) -> bool:
        nonlocal step
        if count not in answer.tried:
            answer.tried[count] = measure(count)
            step += 1
            if progress is not None:
                progress(step, step + 1)
        return answer.tried[count] <= target_s

    largest = MAX_FACTOR * len(nodes)
    meets = [n for n, w in answer.tried.items() if w <= target_s]
    lo = max([floor, *(n for n, w in answer.tried.items() if w > target_s and (not meets or n < min(meets)))])
    if meets:
        hi = min(meets)
    else:
        # Doubling (from one node unless told more): the answer is usually far below the list's size (the
        # trace's peak demand is ~1 % of its cluster), and small clusters replay fastest.
        if lo >= largest:
            return answer
        hi = max(1, 2 * lo)  # zero nodes run nothing
        while not ok(hi):
            if hi >= largest:
                return answer
            lo, hi = hi, min(2 * hi, largest)
    while hi - lo > max(1, math.floor(PRECISION * hi)):
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    answer.nodes = hi
    answer.gpus = sum(len(n.gpus) for n in scaled_nodes(nodes, hi))
    return answer


def sweep_job(nodes: Sequence[Node], pods: Sequence[TimedPod], policy: str, seed: int,
              progress: Callable[[int, int], None] | None = None,
              targets: Sequence[float] = (), floors: Sequence[int] = (),
              seeds: Sequence[int] = ()) -> list[CapacityAnswer]:
    """The capacity search for each target (in the order given, under the known-failing `floors` when
    given) on every one of `seeds` (default: `seed`), one policy, every size replayed at most once per seed
    (a shared cache): the unit of work `benchmarks/timeline.py` sends to a worker process for its sweep.
    Where more nodes never lengthen the wait the answers are those of separate searches."""
    cache: dict[int, float] = {}
    by_seed: dict[int, dict[int, float]] = {}
    bounds = list(floors) or [0] * len(targets)
    return [search(nodes, pods, policy, seed, t, progress, cache=cache, floor=f, seeds=seeds, by_seed=by_seed)
            for t, f in zip(targets, bounds, strict=True)]


def fewest_nodes_possible(nodes: Sequence[Node], pods: Sequence[TimedPod], target_s: float,
                          pools: dict[int, Pools] | None = None) -> int | None:
    """The smallest scaled node list on which the wait bound (`gpupool.sim.wait_bound`) does not rule out a
    p99 wait of `target_s` for every schedule; None: ruled out up to MAX_FACTOR times the list. Every size
    below it is checked, so no policy meets the target there (no monotonicity assumed). `pools` caches the
    pools per size across calls."""
    cache = pools if pools is not None else {}
    for count in range(1, MAX_FACTOR * len(nodes) + 1):
        if count not in cache:
            cache[count] = Pools.build(scaled_nodes(nodes, count), pods)
        if not refuted(cache[count], math.floor(target_s)):
            return count
    return None


def p99_leaving_out(nodes: Sequence[Node], pods: Sequence[TimedPod], policy: str, seed: int,
                    progress: Callable[[int, int], None] | None = None,
                    leave_out: Sequence[int] = ()) -> float:
    """Wait p99 of the replay on `nodes` (as given) without the pods `leave_out` (indices), which count as
    never ran: what a scheduler that refused exactly those pods would reach with this policy."""
    out = set(leave_out)
    log = run_timeline(nodes, [p for k, p in enumerate(pods) if k not in out], policy, seed, progress=progress)
    return percentile_of_waits(np.concatenate([log.waits, np.full(len(out), np.inf)]), 99)


def nodes_needed(p99_by_nodes: dict[int, float], target_s: float) -> int | None:
    """The smallest measured node count whose p99 wait meets `target_s` (None: none does)."""
    return min((n for n, w in p99_by_nodes.items() if w <= target_s), default=None)


def fewer_nodes_targets(a: dict[int, float], b: dict[int, float]) -> list[tuple[float, float]]:
    """The wait targets [lo, hi) for which policy a needs fewer nodes than policy b, from their measured
    p99 waits by node count (`CapacityAnswer.tried`), a node count being the smallest measured size that
    meets the target (`nodes_needed`; none counts as more than any). Exact where every size below each
    answer was measured or more nodes never lengthen the wait (what the search assumes)."""
    edges = sorted({w for w in (*a.values(), *b.values()) if math.isfinite(w)})
    out: list[tuple[float, float]] = []
    for lo, hi in zip(edges, [*edges[1:], math.inf], strict=True):
        na, nb = nodes_needed(a, lo), nodes_needed(b, lo)
        if na is not None and (nb is None or na < nb):
            if out and out[-1][1] == lo:
                out[-1] = (out[-1][0], hi)
            else:
                out.append((lo, hi))
    return out


@dataclass(slots=True)
class TimelineResult:
    log: TimelineLog
    capacity: CapacityAnswer | None
    queues: dict[str, Any] | None = None  # per team queue (gpupool.sim.team_queues), when replayed with queues


def timeline_job(nodes: Sequence[Node], pods: Sequence[TimedPod], policy: str, seed: int,
                 progress: Callable[[int, int], None] | None = None,
                 target_s: float | None = None, queues: Sequence[QueueSpec] | None = None,
                 order: str = "fifo", seeds: Sequence[int] = ()) -> TimelineResult:
    """One policy on the timeline with the node list as given (tie-breaks of `seed`), then (with a target)
    the capacity search on every one of `seeds` (default: `seed`): the unit of work `gpupool simulate
    --timeline` sends to a worker process. With `queues`, pods join team queues (gpupool.sim.team_queues)
    tried in `order`; the capacity search stays without queues."""
    import time

    start = time.perf_counter()
    per_queue: dict[str, Any] | None = None
    if queues:
        hooks = TeamQueues(QueueTree.build(queues), pods, nodes)
        log = run_timeline(nodes, pods, policy, seed, progress=progress, queue=TeamPending(hooks, order), hooks=hooks)
        per_queue = hooks.summary(log.start, log.created, log.end, log.lost_gpu_s)
    else:
        log = run_timeline(nodes, pods, policy, seed, progress=progress)
    log = replace(log, seconds=time.perf_counter() - start)
    answer = search(nodes, pods, policy, seed, target_s, seeds=seeds) if target_s is not None else None
    return TimelineResult(log, answer, per_queue)
