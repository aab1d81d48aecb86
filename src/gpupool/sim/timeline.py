"""Replaying a trace on its own clock: pods arrive at their creation time, wait in a pending queue until
some node takes them, run for as long as they ran in the trace, and leave.

A pod runs for deletion − scheduled time (deletion − creation when the trace never scheduled it). At each
instant, departures free capacity first, then arrivals join the queue, then the queue is tried in its
order; a pod that does not fit stays pending without blocking the pods behind it (as kube-scheduler
retries unschedulable pods). The replay ends at the trace's last deletion: pods still pending then never
ran. The queue's order and an admission rule are plug-ins (`PendingQueue`, `Admit`), so per-team queues
can replace the FIFO. No I/O and no clock here: time is the trace's.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gpupool.core.frag import WorkloadArrays, cluster_fragmentation, table_fragmentation, typical_workload, usable_free
from gpupool.core.model import MILLI_PER_GPU, Node, PodRequest
from gpupool.core.policies import get_policy
from gpupool.core.policy import PolicyContext
from gpupool.core.state import ClusterState
from gpupool.sim.engine import Placer


@dataclass(frozen=True, slots=True)
class TimedPod:
    request: PodRequest
    created: int  # seconds from the start of the trace
    runs_for: int  # seconds it runs once placed
    deleted: int = 0  # the trace's deletion time (the replay ends at the last one)


class PendingQueue(Protocol):
    """The pods waiting to be placed, in the order they are tried."""

    def push(self, index: int, pod: TimedPod) -> None: ...
    def remove(self, index: int) -> None: ...
    def order(self) -> Iterable[int]: ...
    def __len__(self) -> int: ...


class FifoQueue:
    """First come, first tried (a dict keeps insertion order and removes in O(1))."""

    def __init__(self) -> None:
        self._items: dict[int, None] = {}

    def push(self, index: int, pod: TimedPod) -> None:
        self._items[index] = None

    def remove(self, index: int) -> None:
        del self._items[index]

    def order(self) -> Iterable[int]:
        return list(self._items)

    def __len__(self) -> int:
        return len(self._items)


# Whether a pod may start now (quotas, per-team limits); None admits every pod that fits.
Admit = Callable[[TimedPod, ClusterState], bool]


class Hooks(Protocol):
    """Team queues in the replay (gpupool.sim.team_queues): told of every start and end, asked whether a pod
    may start, and, when it may not or does not fit, which running pods to evict for it."""

    def admit(self, k: int) -> bool: ...
    def started(self, k: int, state: ClusterState, t: int) -> None: ...
    def ended(self, k: int, t: int) -> None: ...
    def victims(self, k: int, state: ClusterState, t: int) -> list[int]: ...
    def group(self, k: int) -> str: ...  # pods of one group and shape are refused alike within an instant


@dataclass(frozen=True, slots=True)
class TimelineLog:
    """One policy's replay. Per pod: start time (-1: never ran), node and GPUs. Per event instant t[k]: allocated GPU
    milli, pending pods and expected fragmentation (milli) from t[k] until t[k+1]."""

    capacity_milli: int
    start: np.ndarray
    created: np.ndarray
    t: np.ndarray
    allocated: np.ndarray
    pending: np.ndarray
    fragmented: np.ndarray
    end: int
    node: np.ndarray  # per pod: node index it ran on (-1: never ran)
    gpus: np.ndarray  # per pod: its GPUs as a bit set (GPU j = 1 << j)
    seconds: float = 0.0
    evicted: np.ndarray | None = None  # per pod: times it was evicted (with hooks)
    lost_gpu_s: float = 0.0  # GPU-seconds of work lost to evictions (run time before each, x its GPUs)

    @property
    def waits(self) -> np.ndarray:
        """Seconds each pod waited; infinite for a pod that never ran."""
        return np.where(self.start >= 0, self.start - self.created, np.inf)


def timed_pods(requests: Sequence[PodRequest], times: Sequence[tuple[int, int | None, int]]) -> list[TimedPod]:
    """Pair pods with (creation, scheduled or None, deletion) times."""
    out = []
    for pod, (created, scheduled, deleted) in zip(requests, times, strict=True):
        runs = deleted - (scheduled if scheduled is not None else created)
        out.append(TimedPod(pod, created, max(runs, 0), deleted))
    return out


def run_timeline(nodes: Sequence[Node], pods: Sequence[TimedPod], policy_name: str, seed: int,
                 progress: Callable[[int, int], None] | None = None, queue: PendingQueue | None = None,
                 admit: Admit | None = None, end: int | None = None, hooks: Hooks | None = None) -> TimelineLog:
    """Replay `pods` on `nodes` with one policy. `seed` draws the node order that breaks score ties. With
    `hooks`, an evicted pod goes back to the queue and runs again in full later (its work is lost); `start`
    keeps its first start."""
    state = ClusterState(nodes)
    requests = [p.request for p in pods]
    rng = np.random.default_rng(seed)
    ctx = PolicyContext(rng=np.random.default_rng(seed + 1), workload=typical_workload(requests),
                        rank=rng.permutation(len(state)).astype(np.int64))
    placer = Placer(state, get_policy(policy_name), ctx)
    measure = WorkloadArrays.build(state, ctx.workload)
    frag = cluster_fragmentation(state, measure)
    queue = queue if queue is not None else FifoQueue()
    n = len(pods)
    arrivals = sorted(range(n), key=lambda k: (pods[k].created, k))
    horizon = end if end is not None else max((max(p.deleted, p.created) for p in pods), default=0)
    start = np.full(n, -1, dtype=np.int64)
    node = np.full(n, -1, dtype=np.int64)
    gpus = np.zeros(n, dtype=np.int64)
    running: list[tuple[int, int, int]] = []  # heap of (departure time, pod index, run number)
    runs = np.zeros(n, dtype=np.int64)  # an evicted pod's heap entry is stale once its run number moved on
    began = np.full(n, -1, dtype=np.int64)  # start of the current run
    evicted = np.zeros(n, dtype=np.int64)
    lost_milli_s = 0
    t_log: list[int] = []
    alloc_log: list[int] = []
    pending_log: list[int] = []
    frag_log: list[float] = []
    allocated = 0
    nxt = 0
    while nxt < n or running:
        t = min(pods[arrivals[nxt]].created if nxt < n else horizon + 1, running[0][0] if running else horizon + 1)
        if t > horizon:
            break
        changed: set[int] = set()
        freed = False
        while running and running[0][0] <= t:
            _, k, run = heapq.heappop(running)
            if run != runs[k]:
                continue  # evicted meanwhile
            if hooks is not None:
                hooks.ended(k, t)
            held = state.held[requests[k].key]
            allocated -= sum(g.milli for g in held.allocation.grants)
            changed.add(held.node_index)
            state.release(requests[k].key)
            freed = True
        new: list[int] = []
        while nxt < n and pods[arrivals[nxt]].created == t:
            k = arrivals[nxt]
            queue.push(k, pods[k])
            new.append(k)
            nxt += 1
        # Capacity only shrinks between departures, so pods that waited before still cannot fit: after
        # arrivals alone only the new pods are tried. Within one pass a shape that failed fails again.
        if freed:
            tried = list(queue.order())
        elif isinstance(queue, FifoQueue):
            tried = new  # they are the FIFO's tail, in order
        else:
            fresh = set(new)
            tried = [k for k in queue.order() if k in fresh]
        failed: set[Any] = set()
        for k in tried:
            pod = pods[k]
            shape = (pod.request.cpu_milli, pod.request.memory_mib, pod.request.gpu,
                     hooks.group(k) if hooks is not None else "")
            if shape in failed or (admit is not None and not admit(pod, state)):
                continue
            choice = placer.decide(pod.request) if hooks is None or hooks.admit(k) else None
            if choice is None and hooks is not None:
                gone = hooks.victims(k, state, t)
                for v in gone:
                    held = state.held[requests[v].key]
                    milli = sum(g.milli for g in held.allocation.grants)
                    allocated -= milli
                    lost_milli_s += milli * (t - int(began[v]))
                    changed.add(held.node_index)
                    state.release(requests[v].key)
                    hooks.ended(v, t)
                    runs[v] += 1
                    evicted[v] += 1
                    queue.push(v, pods[v])
                if gone and hooks.admit(k):
                    choice = placer.decide(pod.request)
            if choice is None:
                failed.add(shape)
                continue
            allocated += placer.take(pod.request, choice)
            changed.add(choice.node)
            queue.remove(k)
            if start[k] < 0:
                start[k] = t
            began[k], node[k] = t, choice.node
            gpus[k] = sum(1 << j for j in choice.gpus)
            heapq.heappush(running, (t + pod.runs_for, k, int(runs[k])))
            if hooks is not None:
                hooks.started(k, state, t)
        if changed:
            i = np.array(sorted(changed), dtype=np.int64)
            frag[i] = table_fragmentation(usable_free(state, i), state.cpu_free[i], measure.model_ok[i], measure)
        t_log.append(t)
        alloc_log.append(allocated)
        pending_log.append(len(queue))
        frag_log.append(float(frag.sum()))
        if progress is not None:
            progress(nxt, n)
    return TimelineLog(
        capacity_milli=state.total_gpus * MILLI_PER_GPU,
        start=start,
        created=np.array([p.created for p in pods], dtype=np.int64),
        t=np.array(t_log, dtype=np.int64),
        allocated=np.array(alloc_log, dtype=np.int64),
        pending=np.array(pending_log, dtype=np.int64),
        fragmented=np.array(frag_log),
        end=horizon,
        node=node,
        gpus=gpus,
        evicted=evicted if hooks is not None else None,
        lost_gpu_s=lost_milli_s / MILLI_PER_GPU,
    )
