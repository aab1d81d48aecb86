"""Choosing victims: reclaim (a queue takes back its guarantee from queues that borrowed) and priority
preemption (inside one queue, a higher priority displaces lower ones).

Rules, each there to rule out a failure the peers' users report (shared/reference/queues-and-quotas.md):
- Only a request that stays within its own queue's guarantee may reclaim, and only pods of queues that are
  over their own guarantee when taken are reclaimable: together these make a reclaim never answerable by a
  reclaim back (no eviction loops).
- A pod within its queue's guarantee is never taken for another queue.
- Inside a queue, only strictly lower priority is preempted.
- Without team queues (`NO_QUEUES`: every pod in one queue with no limit), priority alone decides: what the
  scheduler uses for a claim's pod, whose priority preemption kube-scheduler never does (it is gated).
- A preemptor that may not preempt (its pod's `preemptionPolicy: Never`, a non-preempting PriorityClass)
  takes nothing: no eviction, no reclaim, no squeeze.
- A victim is a share and the pods whose eviction frees it (`Running.pods`): a pod's own share is that pod;
  a DRA claim's share is every pod using the claim (one pod for a claim made from its template; all of a
  shared claim's pods, since evicting some frees nothing). Such a share carries the highest priority of its
  pods (so it is preempted only when every one of them is of strictly lower priority) and the earliest start,
  and the least-disruption order counts each pod it evicts.
- Least disruption: per node, candidates are taken greedily (lowest priority, then least run time lost, then
  the newest) until the pod fits, then every victim the fit does not need is given back; among nodes the
  set with the fewest victims wins, then the lowest highest priority, the lowest priority sum, the least run
  time lost, the node name (deterministic, so two cycles never choose differently on the same state).

Time-sharing instead of eviction (`plan_squeeze`, tried before any eviction for a reclaim): a borrowed share
whose compute the interception library enforces (`Running.squeezable`) may keep running with its compute
lowered instead of being evicted. Rules:
- only for reclaim (the preemptor within its own guarantee), and only pods reclaim could take;
- a pod is squeezed no lower than `floor_milli` per GPU, and its queue (and the branch below the ancestor it
  shares with the preemptor) no lower than its guarantee in the compute dimensions it counts: a squeeze
  takes back what was borrowed, never what the borrower is guaranteed;
- memory cannot be squeezed (what a process allocated stays allocated), so a squeeze helps only where the
  preemptor's memory is free already; otherwise the caller falls back to `plan_preemption`;
- least disruption again: the fewest pods squeezed, then the least compute taken, each pod squeezed only as
  far as the fit needs.

Whether the pod then fits on a node is the caller's question (`fits(node, victims)`, `fits_squeezed(node,
{uid: milli})`), so placement rules (GPU fit, shares per GPU, MIG slices) stay where they live. Pure: time
is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpupool.core.queues import NO_LIMIT, ZERO, Admitted, QueueSpec, QueueTree, Quota, admit, charge_of_share

REASON_RECLAIM = "reclaim"
REASON_PRIORITY = "priority"
SQUEEZE_FLOOR_MILLI = 100  # a squeezed pod keeps at least 10 % of each of its GPUs: it must still progress
# No team queues: every pod (and preemptor) in this one queue, which admits anything, so that only priority
# decides (a pod of another queue is never taken, and here there is no other queue).
NO_QUEUE = ""
NO_QUEUES = QueueTree.build([QueueSpec(NO_QUEUE, guaranteed=NO_LIMIT)])


@dataclass(frozen=True, slots=True)
class Share:
    """One GPU of a running pod, as its queue charges it: compute (milli), memory, and the card's memory."""

    milli: int
    memory_mib: int
    card_mib: int


@dataclass(frozen=True, slots=True)
class Running:
    """A pod that holds GPU shares and could be a victim."""

    uid: str
    key: str  # namespace/name, for messages
    queue: str
    node: str
    priority: int
    charge: Quota
    started_at: float
    preemptible: bool = True  # False e.g. while a PodDisruptionBudget forbids its eviction
    squeezable: bool = False  # its compute cap can be lowered while it runs (isolation hook)
    shares: tuple[Share, ...] = ()  # its GPUs as now granted (needed to squeeze it)
    # (namespace/name, UID) of each pod evicted to free the share, when it is not the share itself (a DRA
    # claim's share is freed by evicting the pods that use the claim; see the module doc)
    pods: tuple[tuple[str, str], ...] = ()

    @property
    def evicted(self) -> tuple[tuple[str, str], ...]:
        """(namespace/name, UID) of the pods evicted to take this share: `pods`, or the pod itself."""
        return self.pods or ((self.key, self.uid),)

    def charge_at(self, milli: int) -> Quota:
        """What the pod is charged with its compute lowered to `milli` per GPU (memory unchanged)."""
        return sum((charge_of_share(min(s.milli, milli), s.memory_mib, s.card_mib) for s in self.shares), ZERO)

    @property
    def milli(self) -> int:
        return max((s.milli for s in self.shares), default=0)


@dataclass(frozen=True, slots=True)
class Preemptor:
    uid: str
    queue: str
    priority: int
    charge: Quota
    preempts: bool = True  # False: its pod's preemptionPolicy is Never, it takes nothing from others


@dataclass(frozen=True, slots=True)
class Victim:
    pod: Running
    reason: str  # REASON_RECLAIM or REASON_PRIORITY

    def message(self, preemptor: Preemptor) -> str:
        if self.reason == REASON_RECLAIM:
            return (f"reclaimed for queue {preemptor.queue} (pod {preemptor.uid}): queue {self.pod.queue} "
                    "was using more than its guarantee")
        where = f" in queue {self.pod.queue}" if self.pod.queue != NO_QUEUE else ""
        return (f"preempted{where} by pod {preemptor.uid} of higher priority "
                f"({preemptor.priority} > {self.pod.priority})")


@dataclass(frozen=True, slots=True)
class Plan:
    node: str
    victims: tuple[Victim, ...]

    def cost(self, now: float) -> tuple[int, int, int, float, str]:
        prios = [v.pod.priority for v in self.victims]
        lost = sum(max(0.0, now - v.pod.started_at) for v in self.victims)
        evicted = sum(len(v.pod.evicted) for v in self.victims)  # pods, not shares: a shared claim costs all
        return (evicted, max(prios, default=0), sum(prios), lost, self.node)


def _usage_without(usage: Mapping[str, Quota], taken: Iterable[Running]) -> dict[str, Quota]:
    out = dict(usage)
    for pod in taken:
        out[pod.queue] = out.get(pod.queue, Quota()) - pod.charge
    return out


def _branch(tree: QueueTree, queue: str, other: str) -> str:
    """The ancestor of `queue` (or `queue` itself) just below the first queue it shares with `other`'s
    chain: the branch whose guarantee stands between the two."""
    mine = set(tree.chain(other))
    branch = queue
    for name in tree.chain(queue):
        if name in mine:
            break
        branch = name
    return branch


def victim_reason(tree: QueueTree, usage: Mapping[str, Quota], preemptor: Preemptor, pod: Running,
            in_quota: bool) -> str | None:
    """Why `pod` may be taken for `preemptor` with the queues at `usage` (victims chosen so far removed), or
    None if it may not."""
    if not preemptor.preempts or not pod.preemptible or pod.uid == preemptor.uid:
        return None
    if any(uid == preemptor.uid for _, uid in pod.pods):
        return None  # a share of the preemptor's own pod (a claim it already uses)
    if pod.queue == preemptor.queue:
        return REASON_PRIORITY if pod.priority < preemptor.priority else None
    if not in_quota or pod.queue not in tree.specs:
        return None
    sub = tree.subtree_usage(usage)
    # The victim's queue, and its branch below the first ancestor it shares with the preemptor, must both
    # be borrowing on a dimension the victim holds: then the victim is (partly) borrowed capacity.
    branch = _branch(tree, pod.queue, preemptor.queue)
    held = [d for d, v in zip(("gpu_milli", "memory_mib", "cores"), pod.charge.values(), strict=True) if v > 0]
    for name in {pod.queue, branch}:
        over = tree.specs[name].borrowed(sub[name])
        if not any(getattr(over, d) > 0 for d in held):
            return None
    return REASON_RECLAIM


def in_quota(tree: QueueTree, usage: Mapping[str, Quota], preemptor: Preemptor) -> bool:
    """Whether the preemptor stays within its own queue's guarantee once admitted: only then may it reclaim."""
    spec = tree.specs.get(preemptor.queue)
    return spec is not None and spec.within_guarantee(usage.get(preemptor.queue, Quota()) + preemptor.charge)


def plan_preemption(
    tree: QueueTree,
    usage: Mapping[str, Quota],
    preemptor: Preemptor,
    running: Iterable[Running],
    fits: Callable[[str, frozenset[str]], bool],
    now: float,
) -> Plan | None:
    """The least disruptive set of victims on one node after whose eviction the preemptor is admitted by
    its queue and fits on that node (`fits(node, victim uids)`), or None when no such set exists."""
    reclaims = in_quota(tree, usage, preemptor)
    by_node: dict[str, list[Running]] = {}
    for pod in running:
        by_node.setdefault(pod.node, []).append(pod)
    best: Plan | None = None
    for node in sorted(by_node):
        plan = _plan_on_node(tree, usage, preemptor, by_node[node], fits, now, reclaims, node)
        if plan is not None and (best is None or plan.cost(now) < best.cost(now)):
            best = plan
    return best


def _satisfied(tree: QueueTree, usage: Mapping[str, Quota], preemptor: Preemptor, node: str,
               taken: list[Victim], fits: Callable[[str, frozenset[str]], bool]) -> bool:
    left = _usage_without(usage, (v.pod for v in taken))
    if not isinstance(admit(tree, left, preemptor.queue, preemptor.charge), Admitted):
        return False
    return fits(node, frozenset(v.pod.uid for v in taken))


def _plan_on_node(tree: QueueTree, usage: Mapping[str, Quota], preemptor: Preemptor, pods: list[Running],
                  fits: Callable[[str, frozenset[str]], bool], now: float, in_quota: bool, node: str) -> Plan | None:
    order = sorted(pods, key=lambda p: (p.priority, max(0.0, now - p.started_at), -p.started_at, p.uid))
    taken: list[Victim] = []
    for pod in order:
        if _satisfied(tree, usage, preemptor, node, taken, fits):
            break
        why = victim_reason(tree, _usage_without(usage, (v.pod for v in taken)), preemptor, pod, in_quota)
        if why is not None:
            taken.append(Victim(pod, why))
    if not taken or not _satisfied(tree, usage, preemptor, node, taken, fits):
        return None
    # Give back every victim the fit does not need, most costly to evict first.
    for victim in sorted(taken, key=lambda v: (-v.pod.priority, -(now - v.pod.started_at), v.pod.uid)):
        rest = [v for v in taken if v is not victim]
        if rest and _satisfied(tree, usage, preemptor, node, rest, fits):
            taken = rest
    return Plan(node, tuple(taken))


# ---- time-sharing instead of eviction -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Squeeze:
    pod: Running
    milli: int  # the compute per GPU the pod is lowered to

    def message(self, preemptor: Preemptor) -> str:
        return (f"compute squeezed from {self.pod.milli / 10:g} % to {self.milli / 10:g} % per GPU for queue "
                f"{preemptor.queue} (pod {preemptor.uid}): queue {self.pod.queue} was using more than its "
                "guarantee; lifted when it no longer is")


@dataclass(frozen=True, slots=True)
class SqueezePlan:
    node: str
    squeezes: tuple[Squeeze, ...]

    def cost(self) -> tuple[int, int, int, str]:
        taken = sum((s.pod.milli - s.milli) * len(s.pod.shares) for s in self.squeezes)
        return (len(self.squeezes), taken, max((s.pod.priority for s in self.squeezes), default=0), self.node)


def _usage_squeezed(usage: Mapping[str, Quota], squeezes: Mapping[str, tuple[Running, int]]) -> dict[str, Quota]:
    out = dict(usage)
    for pod, milli in squeezes.values():
        out[pod.queue] = out.get(pod.queue, Quota()) - pod.charge + pod.charge_at(milli)
    return out


def _lowest(tree: QueueTree, usage: Mapping[str, Quota], preemptor: Preemptor, pod: Running,
            floor_milli: int) -> int:
    """The lowest compute per GPU `pod` may be squeezed to: its queue, and its branch below the ancestor it
    shares with the preemptor, stay at or above their guarantees in the compute dimensions they count."""
    branch = _branch(tree, pod.queue, preemptor.queue)
    sub = tree.subtree_usage(usage)

    def keeps_guarantee(milli: int) -> bool:
        cut = pod.charge - pod.charge_at(milli)
        for name in {pod.queue, branch}:
            spec, after = tree.specs[name], sub[name] - cut
            for dim in ("gpu_milli", "cores"):
                if dim in spec.dims and getattr(cut, dim) > 0 and getattr(after, dim) < getattr(spec.guaranteed, dim):
                    return False
        return bool({"gpu_milli", "cores"} & tree.specs[pod.queue].dims)

    low, high = min(floor_milli, pod.milli), pod.milli  # keeps_guarantee(high) holds when anything is counted
    if not keeps_guarantee(high):
        return high
    while low < high:  # charges fall as the squeeze deepens: the lowest milli that still keeps the guarantee
        mid = (low + high) // 2
        if keeps_guarantee(mid):
            high = mid
        else:
            low = mid + 1
    return high


def plan_squeeze(
    tree: QueueTree,
    usage: Mapping[str, Quota],
    preemptor: Preemptor,
    running: Iterable[Running],
    fits_squeezed: Callable[[str, Mapping[str, int]], bool],
    now: float,
    floor_milli: int = SQUEEZE_FLOOR_MILLI,
) -> SqueezePlan | None:
    """The least disruptive set of compute squeezes on one node after which the preemptor is admitted by its
    queue and fits there (`fits_squeezed(node, {uid: milli per GPU})`), or None: then evict
    (`plan_preemption`). Only a reclaim squeezes (see the module doc)."""
    if not in_quota(tree, usage, preemptor):
        return None
    by_node: dict[str, list[Running]] = {}
    for pod in running:
        if pod.squeezable and pod.shares and pod.milli > floor_milli:
            by_node.setdefault(pod.node, []).append(pod)
    best: SqueezePlan | None = None
    for node in sorted(by_node):
        plan = _squeeze_on_node(tree, usage, preemptor, by_node[node], fits_squeezed, now, floor_milli, node)
        if plan is not None and (best is None or plan.cost() < best.cost()):
            best = plan
    return best


def _squeeze_on_node(tree: QueueTree, usage: Mapping[str, Quota], preemptor: Preemptor, pods: list[Running],
                     fits_squeezed: Callable[[str, Mapping[str, int]], bool], now: float, floor_milli: int,
                     node: str) -> SqueezePlan | None:
    def satisfied(chosen: Mapping[str, tuple[Running, int]]) -> bool:
        left = _usage_squeezed(usage, chosen)
        if not isinstance(admit(tree, left, preemptor.queue, preemptor.charge), Admitted):
            return False
        return fits_squeezed(node, {uid: milli for uid, (_, milli) in chosen.items()})

    order = sorted(pods, key=lambda p: (p.priority, max(0.0, now - p.started_at), -p.started_at, p.uid))
    chosen: dict[str, tuple[Running, int]] = {}
    for pod in order:
        if satisfied(chosen):
            break
        left = _usage_squeezed(usage, chosen)
        if victim_reason(tree, left, preemptor, pod, True) != REASON_RECLAIM:
            continue
        lowest = _lowest(tree, left, preemptor, pod, floor_milli)
        if lowest < pod.milli:
            chosen[pod.uid] = (pod, lowest)
    if not chosen or not satisfied(chosen):
        return None
    # Squeeze each pod only as far as the fit needs (the last chosen first: the first are the cheapest to
    # squeeze), and give back those it does not need at all.
    for uid in reversed(list(chosen)):
        pod, lowest = chosen[uid]
        low, high = lowest, pod.milli
        while low < high:  # the highest milli that still satisfies, the others as they stand
            mid = (low + high + 1) // 2
            if satisfied({**chosen, uid: (pod, mid)}):
                low = mid
            else:
                high = mid - 1
        if low >= pod.milli:
            del chosen[uid]
        else:
            chosen[uid] = (pod, low)
    return SqueezePlan(node, tuple(Squeeze(pod, milli) for pod, milli in chosen.values()))
