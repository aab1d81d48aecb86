"""How many of these nodes a workload needs: the smallest scaled copy of a node list whose timeline
replay meets a wait target (p99, a pod that never ran counting as waiting forever).

Scaling keeps the mix: the nodes are grouped by shape (CPU, memory, GPU count and model) and each group
gets its share of the total by largest remainder, whole nodes only; beyond the list's own size nodes are
copied. The search assumes that adding nodes never lengthens the p99 wait (true of the FIFO queue up to
tie-breaks): it doubles from one node until the target is met (at most MAX_FACTOR times the list), then
bisects to PRECISION of the answer (at least one node): the answer is the smallest size tried that
meets the target, and the next smaller size tried did not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpupool.core.model import Node
from gpupool.core.queues import QueueSpec, QueueTree
from gpupool.sim.team_queues import TeamPending, TeamQueues
from gpupool.sim.timeline import TimedPod, TimelineLog, run_timeline
from gpupool.sim.timeline_report import wait_percentile

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
    tried: dict[int, float] = field(default_factory=dict)  # node count -> wait p99 (s)

    @property
    def best(self) -> tuple[int, float]:
        """The size with the shortest p99 wait (the smallest such)."""
        return min(self.tried.items(), key=lambda kv: (kv[1], kv[0]))


def search(nodes: Sequence[Node], pods: Sequence[TimedPod], policy: str, seed: int, target_s: float,
           progress: Callable[[int, int], None] | None = None,
           p99: Callable[[list[Node]], float] | None = None) -> CapacityAnswer:
    """The smallest scaled node list whose p99 wait is at most `target_s`."""
    def measure(count: int) -> float:
        scaled = scaled_nodes(nodes, count)
        return p99(scaled) if p99 is not None else wait_percentile(run_timeline(scaled, pods, policy, seed), 99)

    answer = CapacityAnswer(target_s, None, None)
    step = 0

    def ok(count: int) -> bool:
        nonlocal step
        if count not in answer.tried:
            answer.tried[count] = measure(count)
            step += 1
            if progress is not None:
                progress(step, step + 1)
        return answer.tried[count] <= target_s

    # Doubling from one node: the answer is usually far below the list's size (the trace's peak demand is
    # ~1 % of its cluster), and small clusters replay fastest.
    lo, hi = 0, 1  # zero nodes run nothing
    while not ok(hi):
        if hi >= MAX_FACTOR * len(nodes):
            return answer
        lo, hi = hi, min(2 * hi, MAX_FACTOR * len(nodes))
    while hi - lo > max(1, math.floor(PRECISION * hi)):
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    answer.nodes = hi
    answer.gpus = sum(len(n.gpus) for n in scaled_nodes(nodes, hi))
    return answer


@dataclass(slots=True)
class TimelineResult:
    log: TimelineLog
    capacity: CapacityAnswer | None
    queues: dict[str, Any] | None = None  # per team queue (gpupool.sim.team_queues), when replayed with queues


def timeline_job(nodes: Sequence[Node], pods: Sequence[TimedPod], policy: str, seed: int,
                 progress: Callable[[int, int], None] | None = None,
                 target_s: float | None = None, queues: Sequence[QueueSpec] | None = None,
                 order: str = "fifo") -> TimelineResult:
    """One policy on the timeline with the node list as given, then (with a target) the capacity search:
    the unit of work `gpupool simulate --timeline` sends to a worker process. With `queues`, pods join team
    queues (gpupool.sim.team_queues) tried in `order`; the capacity search stays without queues."""
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
    answer = search(nodes, pods, policy, seed, target_s) if target_s is not None else None
    return TimelineResult(log, answer, per_queue)
