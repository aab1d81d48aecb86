"""Lower bounds on unallocated GPU % at arrived = 100 %: how far could any placement policy go?

When arrived demand reaches the cluster's capacity, the unallocated compute equals both the demand that
was dropped and the compute that is still free. The free compute includes the slack on every GPU that
holds shares, so unallocated >= the least slack with which the placed shares can be packed onto GPUs.
The bounds relax everything else (CPU, memory, models, node boundaries, arrival order); they look only at
the one-GPU shares, because whole GPUs pack without slack.

* `fractional_slack`: shares above half a GPU each need a GPU of their own; smaller ones may be split to
  fill the remainders next to them. What cannot be filled is a quick estimate, assuming every share is
  placed.
* `least_slack`: the same question with shares kept whole: a cutting-stock integer program over every
  way to fill one GPU. Solved with scipy's HiGHS; the answer is the solver's proven lower bound.
* `least_unallocated`: no assumption about what is placed. Dropping a share removes its slack but counts
  its demand as unallocated, so unallocated >= max(slack of the placed shares, demand of the dropped
  ones); the program minimises that over every choice of shares to drop. This holds for any policy,
  online or not, including one that refuses pods that fit.

scipy is needed only here (it comes with the `test` extras); the simulator does not import this module.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpupool.core.model import MILLI_PER_GPU, PodRequest

HALF = MILLI_PER_GPU // 2
TIME_LIMIT_S = 60.0


def arrived(submitted: Sequence[PodRequest], capacity_milli: int) -> list[PodRequest]:
    """The pods that arrive before their GPU demand passes the cluster's capacity (the replay's bucket)."""
    total = 0
    out = []
    for p in submitted:
        if total + p.gpu.total_milli > capacity_milli:
            break
        total += p.gpu.total_milli
        out.append(p)
    return out


def one_gpu_share(pod: PodRequest) -> int:
    """Per-GPU milli of a pod sharing one GPU; 0 for any other pod (whole GPUs pack without slack)."""
    return pod.gpu.milli if pod.gpu.count == 1 and pod.gpu.milli < MILLI_PER_GPU else 0


def arrived_shares(submitted: Sequence[PodRequest], capacity_milli: int) -> tuple[list[int], float]:
    """Per-GPU milli of the one-GPU sharing pods among those arriving before demand passes capacity,
    and the arrived demand as % of capacity."""
    pods = arrived(submitted, capacity_milli)
    shares = [s for s in map(one_gpu_share, pods) if s]
    return shares, 100.0 * sum(p.gpu.total_milli for p in pods) / capacity_milli


def fractional_slack(shares: Sequence[int]) -> float:
    """Milli left empty in the remainders next to shares above half a GPU when the small shares that fit
    are poured in, split as needed. Remainders ascending, each taking what it can from the pool of small
    shares that fit it: the pool only grows as remainders grow, so this greedy fill is the largest."""
    arr = np.asarray(shares, dtype=np.int64)
    remainders = np.sort(MILLI_PER_GPU - arr[arr > HALF])
    small = np.sort(arr[arr <= HALF])
    pool = filled = 0.0
    j = 0
    for r in remainders:
        while j < len(small) and small[j] <= r:
            pool += float(small[j])
            j += 1
        take = min(float(r), pool)
        pool -= take
        filled += take
    return float(remainders.sum()) - filled


def patterns(counts: dict[int, int]) -> tuple[list[int], np.ndarray]:
    """Every way to fill one GPU: sizes (descending) and a [sizes, patterns] matrix of how many of each
    size a pattern holds (no more than there are), total milli <= one GPU, at least one share."""
    sizes = sorted(counts, reverse=True)
    found: list[tuple[int, ...]] = []

    def extend(i: int, room: int, taken: list[int]) -> None:
        if i == len(sizes):
            if any(taken):
                found.append(tuple(taken))
            return
        for k in range(min(room // sizes[i], counts[sizes[i]]), -1, -1):
            taken.append(k)
            extend(i + 1, room - k * sizes[i], taken)
            taken.pop()

    extend(0, MILLI_PER_GPU, [])
    return sizes, np.array(found, dtype=np.float64).T.reshape(len(sizes), len(found))


def _proven(res: Any) -> float:
    """The solver's proven lower bound on its objective (0, the trivial one, if it proved none)."""
    bound = getattr(res, "mip_dual_bound", None)
    return float(bound) if bound is not None and np.isfinite(bound) else 0.0


@dataclass(frozen=True, slots=True)
class Bound:
    """A proven lower bound in milli-GPU, and whether the solver closed the gap (then it is attained)."""

    milli: float
    exact: bool


def least_slack(required: Iterable[int], optional: Iterable[int] = ()) -> Bound:
    """Least total slack (milli) on the GPUs holding shares when every `required` share is placed whole
    and any of the `optional` ones may be placed too (to fill gaps) or left out."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    need, total = Counter(required), Counter(required) + Counter(optional)
    if not total:
        return Bound(0.0, True)
    sizes, a = patterns(total)
    n_pat, n_size = a.shape[1], len(sizes)
    # Variables: GPUs per pattern, and the optional shares left out per size. Slack = one GPU per pattern
    # used minus the shares placed, so up to a constant it is 1000 * GPUs + milli left out; written this
    # way (rather than as each pattern's slack) the solver proves the optimum in seconds, not minutes.
    cost = np.concatenate([np.full(n_pat, float(MILLI_PER_GPU)), np.array(sizes, dtype=np.float64)])
    each = [total[s] for s in sizes]
    placed = LinearConstraint(np.hstack([a, np.eye(n_size)]), lb=each, ub=each)
    left_out = Bounds(0, np.concatenate([np.full(n_pat, np.inf), [total[s] - need[s] for s in sizes]]))
    res = milp(cost, constraints=placed, integrality=np.ones(n_pat + n_size), bounds=left_out,
               options={"time_limit": TIME_LIMIT_S})
    return Bound(max(0.0, _proven(res) - float(np.dot(sizes, each))), bool(res.status == 0))


def least_unallocated(shares: Iterable[int]) -> Bound:
    """Least max(slack of the placed shares, demand of the dropped ones) over every choice of shares to
    drop (milli): a bound on unallocated compute for any policy that meets these shares."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    counts = Counter(shares)
    if not counts:
        return Bound(0.0, True)
    sizes, a = patterns(counts)
    n_pat, n_size = a.shape[1], len(sizes)
    size = np.array(sizes, dtype=np.float64)
    slack = MILLI_PER_GPU - size @ a
    # Variables: pattern counts, dropped counts per size, and z = the bound (the only continuous one).
    cost = np.zeros(n_pat + n_size + 1)
    cost[-1] = 1.0
    each = [counts[s] for s in sizes]
    placed = LinearConstraint(np.hstack([a, np.eye(n_size), np.zeros((n_size, 1))]), lb=each, ub=each)
    above_slack = LinearConstraint(np.concatenate([slack, np.zeros(n_size), [-1.0]])[None, :], ub=0.0)
    above_dropped = LinearConstraint(np.concatenate([np.zeros(n_pat), size, [-1.0]])[None, :], ub=0.0)
    res = milp(cost, constraints=[placed, above_slack, above_dropped],
               integrality=np.concatenate([np.ones(n_pat + n_size), [0]]), bounds=Bounds(0, np.inf),
               options={"time_limit": TIME_LIMIT_S})
    return Bound(_proven(res), bool(res.status == 0))


def filled_until(submitted: Sequence[PodRequest], capacity_milli: int) -> tuple[Bound, float]:
    """A bound for policies that place every share arriving while the cluster still has room for the
    largest share size, and the arrived % where it is met (milli, %).

    Let k be the arrival after which no GPU has room for the largest share below a whole GPU (810 milli
    on the traces) on a node with the CPU and memory of the largest such pod. Nothing departs, so from k
    on every pod needing that much of a GPU, CPU and memory is dropped: unallocated >= their demand. If
    every share before k was placed, unallocated >= the least slack with those shares placed (later
    ones may fill gaps). k depends on the policy; the least over k of the larger of the two holds for
    every such policy. The first term grows with k and the second shrinks, so a bisection finds it."""
    pods = arrived(submitted, capacity_milli)
    shares = [p for p in pods if one_gpu_share(p)]
    if not shares:
        return Bound(0.0, True), 100.0 * sum(p.gpu.total_milli for p in pods) / capacity_milli
    largest = max(p.gpu.milli for p in shares)
    cpu = max(p.cpu_milli for p in shares if p.gpu.milli == largest)
    memory = max(p.memory_mib for p in shares if p.gpu.milli == largest)
    big = np.array([p.gpu.total_milli if p.gpu.milli >= largest and p.cpu_milli >= cpu and p.memory_mib >= memory
                    else 0 for p in pods], dtype=np.float64)
    big_after = np.concatenate([np.cumsum(big[::-1])[::-1], [0.0]])  # [k]: demand of big pods from k on
    share_at = [one_gpu_share(p) for p in pods]

    def slack(k: int) -> Bound:
        return least_slack([s for s in share_at[:k] if s], [s for s in share_at[k:] if s])

    lo, hi = 0, len(pods)  # slack(lo) < big_after[lo]; past hi the slack term leads
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if slack(mid).milli < big_after[mid]:
            lo = mid
        else:
            hi = mid
    at_lo, at_hi = slack(lo), slack(hi)
    best = min((Bound(max(at_lo.milli, big_after[lo]), at_lo.exact), lo),
               (Bound(max(at_hi.milli, big_after[hi]), at_hi.exact), hi), key=lambda bk: bk[0].milli)
    reached = sum(p.gpu.total_milli for p in pods[: best[1]])
    return best[0], 100.0 * reached / capacity_milli
