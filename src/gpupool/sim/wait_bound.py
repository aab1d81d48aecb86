"""A lower bound on the wait percentile of the timeline replay that holds for every placement policy, and
for every queue order too: no schedule of the trace's pods on a node list can wait less.

Relaxation: the cluster becomes three pools (GPU compute in milli, CPU, memory: any placement on nodes
also respects the pools) and a pod may start at any time from its creation, in any order, but once it
starts it runs for its trace duration without pause (as in `run_timeline`). A pod that fits no node of
the list when that node is empty can never run.

Suppose a schedule meets `p_q(wait) <= W`. With the replay's percentile (no interpolation, a pod that never
ran waiting forever) that means at most E = n - ceil(q n / 100) pods wait longer than W or never run; the
schedule picks which. Every other pod p starts at some s in [c_p, min(c_p + W, horizon)] (created c_p, the
replay ends at `horizon`) and runs d_p seconds, so it surely holds its resources during its *compulsory
part* [min(c_p + W, horizon), c_p + d_p). At every instant the compulsory parts of the pods that are not
excused must fit each pool: with x_p = 1 when p is excused,

    sum over p compulsory at t of  a_p,r * (1 - x_p)  <=  capacity_r     for every instant t and pool r,

i.e. sum a_p,r x_p >= load_r(t) - capacity_r =: D. Coefficients may be cut to min(a_p,r, D) (a 0/1 solution
satisfies the cut row iff it satisfies the original). The least number of excused pods is at least the
optimum of this covering program with 0 <= x_p <= 1 (a linear program, scipy's HiGHS), rounded up; if that
exceeds E, no schedule meets W. Fewer pods are compulsory as W grows, so refutation is monotone in W and
a bisection finds the smallest W that is not refuted: every schedule's p_q wait is at least that.

The bound is weak where pods run shorter than the wait target (they have no compulsory part) and strong
where long-running pods pile up; it knows nothing of fragmentation, so a gap to the policies' figures is
the sum of what placement wastes and what the relaxation forgets.

`witness` goes the other way: a set of pods to leave out (chosen greedily) after which the others, each
started the moment it is created, fit the pools at every instant. When it leaves out at most E pods, the
pooled relaxation's p_q wait is exactly 0 and the bound is attained there.

`pooled_fifo_starts` is *not* a bound: it is `run_timeline`'s FIFO queue (departures, then arrivals, then
the queue in order, a pod that does not fit not blocking those behind it) on the pools. Greedy list
scheduling is not monotone in capacity: on the pools every freed milli is taken at once by the next pod
that fits, long-running pods included, and the bigger pods behind them can starve, so this replay can
wait longer than a policy placing on real nodes. It does on the bundled trace: there perfect packing
alone would not shorten the waits, the order in which the queue admits pods decides them.

scipy is needed only for the bound (the `test` extras, as for `gpupool.sim.bound`). No I/O and no clock.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.core.fit import OK, check
from gpupool.core.model import MILLI_PER_GPU, Node, PodRequest
from gpupool.core.state import ClusterState
from gpupool.sim.timeline import TimedPod
from gpupool.sim.timeline_report import percentile_of_waits

EPS = 1e-6  # LP optimum slack before rounding up


def fits_some_node(nodes: Sequence[Node], requests: Sequence[PodRequest]) -> np.ndarray:
    """Per request: whether some node of `nodes`, empty, can host it (checked once per request shape)."""
    state = ClusterState(nodes)
    seen: dict[tuple[object, ...], bool] = {}
    out = np.zeros(len(requests), dtype=bool)
    for k, r in enumerate(requests):
        key = (r.cpu_milli, r.memory_mib, r.gpu)
        if key not in seen:
            seen[key] = bool(nodes) and bool((check(state, r).code == OK).any())
        out[k] = seen[key]
    return out


def allowed_late(n: int, q: float) -> int:
    """How many of n pods may wait longer than W (or never run) while the q-th percentile stays <= W."""
    return n - math.ceil(q * n / 100 - 1e-9)


@dataclass(frozen=True, slots=True)
class Pools:
    """The trace as the bound sees it: per pod its demand on each pool, times, and whether it can run."""

    demand: np.ndarray  # [n, 3]: GPU milli, CPU milli, memory MiB
    capacity: np.ndarray  # [3]
    created: np.ndarray
    runs_for: np.ndarray
    feasible: np.ndarray
    horizon: int

    @staticmethod
    def build(nodes: Sequence[Node], pods: Sequence[TimedPod], end: int | None = None) -> Pools:
        requests = [p.request for p in pods]
        return Pools(
            demand=np.array([(r.gpu.total_milli, r.cpu_milli, r.memory_mib) for r in requests], dtype=np.int64
                            ).reshape(len(pods), 3),
            capacity=np.array([MILLI_PER_GPU * sum(len(n.gpus) for n in nodes), sum(n.cpu_milli for n in nodes),
                               sum(n.memory_mib for n in nodes)], dtype=np.int64),
            created=np.array([p.created for p in pods], dtype=np.int64),
            runs_for=np.array([p.runs_for for p in pods], dtype=np.int64),
            feasible=fits_some_node(nodes, requests),
            horizon=end if end is not None else max((max(p.deleted, p.created) for p in pods), default=0),
        )


def compulsory(pools: Pools, wait: int) -> tuple[np.ndarray, np.ndarray]:
    """Per pod [begin, finish) of its compulsory part when it waits at most `wait` (empty: begin >= finish)."""
    return np.minimum(pools.created + wait, pools.horizon), pools.created + pools.runs_for


def least_late(pools: Pools, wait: int) -> int:
    """A lower bound on how many pods wait longer than `wait` (or never run) in any schedule."""
    forced = int((~pools.feasible).sum())
    begin, finish = compulsory(pools, wait)
    live = np.flatnonzero(pools.feasible & (finish > begin) & (pools.demand > 0).any(axis=1))
    if len(live) == 0:
        return forced
    # Sweep the compulsory parts: between consecutive breakpoints the set of compulsory pods is constant.
    times = np.unique(np.concatenate([begin[live], finish[live]]))
    lo = np.searchsorted(times, begin[live])  # part k covers elementary intervals lo[k] .. hi[k]-1
    hi = np.searchsorted(times, finish[live])
    load = np.zeros((len(times), 3), dtype=np.int64)
    np.add.at(load, lo, pools.demand[live])
    np.add.at(load, hi, -pools.demand[live])
    load = np.cumsum(load, axis=0)
    over = load - pools.capacity  # per elementary interval and pool: what must be excused
    # One row per overloaded (interval, pool): the pods compulsory there, coefficients cut to the overload.
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    need: list[np.ndarray] = []
    base = 0
    for j in range(3):
        at = np.flatnonzero(over[:, j] > 0)  # overloaded intervals of pool j, sorted
        if len(at) == 0:
            continue
        first, last = np.searchsorted(at, lo), np.searchsorted(at, hi)  # pod k covers at[first[k]:last[k]]
        count = last - first
        pod = np.repeat(np.arange(len(live)), count)
        row = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count) + np.repeat(first, count)
        a = np.minimum(pools.demand[live[pod], j], over[at[row], j])
        keep = a > 0
        cols.append(pod[keep])
        vals.append(a[keep].astype(np.float64))
        rows.append(base + row[keep])
        need.append(over[at, j].astype(np.float64))
        base += len(at)
    if base == 0:
        return forced
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix

    matrix = csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(base, len(live)))
    res = linprog(np.ones(len(live)), A_ub=-matrix, b_ub=-np.concatenate(need), bounds=(0, 1), method="highs")
    if res.status != 0:  # cannot happen (x = 1 everywhere is feasible); count it as no information
        return forced
    return forced + math.ceil(float(res.fun) - EPS)


def refuted(pools: Pools, wait: int, q: float = 99) -> bool:
    """True when no schedule's q-th percentile wait can be at most `wait`."""
    return least_late(pools, wait) > allowed_late(len(pools.created), q)


def wait_lower_bound(nodes: Sequence[Node], pods: Sequence[TimedPod], q: float = 99, end: int | None = None) -> float:
    """The least q-th percentile wait (s) any schedule of `pods` on `nodes` can have by this bound: the
    smallest whole second not refuted (waits are whole seconds); infinite when even waiting until the
    replay's end is refuted (too many pods fit no node, or the pods running at the end overflow)."""
    if not pods:
        return 0.0
    pools = Pools.build(nodes, pods, end)
    if not refuted(pools, 0, q):
        return 0.0
    if refuted(pools, pools.horizon, q):
        return math.inf
    lo, hi = 0, pools.horizon  # refuted at lo, not at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if refuted(pools, mid, q):
            lo = mid
        else:
            hi = mid
    return float(hi)


def witness(pools: Pools, wait: int = 0) -> np.ndarray:
    """Pods to leave out (sorted indices; those that fit no node first among them) so that the compulsory
    parts of the others fit every pool at every instant. Greedy: at the instant and pool most overloaded
    (relative to capacity), leave out the pod there with the most demand x compulsory seconds."""
    begin, finish = compulsory(pools, wait)
    out = np.flatnonzero(~pools.feasible).tolist()
    live = pools.feasible & (finish > begin) & (pools.demand > 0).any(axis=1)
    scale = np.maximum(pools.capacity, 1).astype(np.float64)
    while live.any():
        idx = np.flatnonzero(live)
        times = np.unique(np.concatenate([begin[idx], finish[idx]]))
        lo, hi = np.searchsorted(times, begin[idx]), np.searchsorted(times, finish[idx])
        load = np.zeros((len(times), 3), dtype=np.int64)
        np.add.at(load, lo, pools.demand[idx])
        np.add.at(load, hi, -pools.demand[idx])
        over = (np.cumsum(load, axis=0) - pools.capacity) / scale
        i, j = np.unravel_index(int(np.argmax(over)), over.shape)
        if over[i, j] <= 0:
            break
        here = idx[(lo <= i) & (hi > i)]
        weight = pools.demand[here, j] * (finish[here] - begin[here])
        k = int(here[int(np.argmax(weight))])
        live[k] = False
        out.append(k)
    return np.array(sorted(out), dtype=np.int64)


def pooled_fifo_starts(pools: Pools, pods: Sequence[TimedPod]) -> np.ndarray:
    """Start time of each pod when `run_timeline`'s FIFO queue places on the pools (-1: never ran). Not a
    bound (see the module's doc)."""
    n = len(pods)
    need = [tuple(int(v) for v in row) for row in pools.demand]
    free = [int(v) for v in pools.capacity]
    arrivals = sorted(range(n), key=lambda k: (pods[k].created, k))
    start = np.full(n, -1, dtype=np.int64)
    queue: dict[int, None] = {}  # FIFO: insertion order; pods that fit no node never join
    running: list[tuple[int, int]] = []  # heap of (departure time, pod index)
    nxt = 0
    while nxt < n or running:
        t = min(pods[arrivals[nxt]].created if nxt < n else pools.horizon + 1,
                running[0][0] if running else pools.horizon + 1)
        if t > pools.horizon:
            break
        freed = False
        while running and running[0][0] <= t:
            k = heapq.heappop(running)[1]
            free = [f + d for f, d in zip(free, need[k], strict=True)]
            freed = True
        new: list[int] = []
        while nxt < n and pods[arrivals[nxt]].created == t:
            k = arrivals[nxt]
            nxt += 1
            if pools.feasible[k]:
                queue[k] = None
                new.append(k)
        failed: set[tuple[int, ...]] = set()  # within a pass a shape that failed fails again
        for k in list(queue) if freed else new:
            if need[k] in failed:
                continue
            if any(d > f for d, f in zip(need[k], free, strict=True)):
                failed.add(need[k])
                continue
            free = [f - d for f, d in zip(free, need[k], strict=True)]
            del queue[k]
            start[k] = t
            heapq.heappush(running, (t + pods[k].runs_for, k))
    return start


def percentile_of_starts(pods: Sequence[TimedPod], start: np.ndarray, q: float = 99) -> float:
    """The q-th percentile wait of given starts (-1: never started), as the replay counts it."""
    created = np.array([p.created for p in pods], dtype=np.int64)
    return percentile_of_waits(np.where(start >= 0, start - created, np.inf), q)
