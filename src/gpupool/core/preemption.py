"""Choosing victims: reclaim (a queue takes back its guarantee from queues that borrowed) and priority
preemption (inside one queue, a higher priority displaces lower ones).

Rules, each there to rule out a failure the peers' users report (shared/reference/queues-and-quotas.md):
- Only a request that stays within its own queue's guarantee may reclaim, and only pods of queues that are
  over their own guarantee when taken are reclaimable: together these make a reclaim never answerable by a
  reclaim back (no eviction loops).
- A pod within its queue's guarantee is never taken for another queue.
- Inside a queue, only strictly lower priority is preempted.
- Least disruption: per node, candidates are taken greedily (lowest priority, then least run time lost, then
  the newest) until the pod fits, then every victim the fit does not need is given back; among nodes the
  set with the fewest victims wins, then the lowest highest priority, the lowest priority sum, the least run
  time lost, the node name (deterministic, so two cycles never choose differently on the same state).

Whether the pod then fits on a node is the caller's question (`fits(node, victims)`), so placement rules
(GPU fit, shares per GPU, MIG slices) stay where they live. Pure: time is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpupool.core.queues import Admitted, QueueTree, Quota, admit

REASON_RECLAIM = "reclaim"
REASON_PRIORITY = "priority"


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


@dataclass(frozen=True, slots=True)
class Preemptor:
    uid: str
    queue: str
    priority: int
    charge: Quota


@dataclass(frozen=True, slots=True)
class Victim:
    pod: Running
    reason: str  # REASON_RECLAIM or REASON_PRIORITY

    def message(self, preemptor: Preemptor) -> str:
        if self.reason == REASON_RECLAIM:
            return (f"reclaimed for queue {preemptor.queue} (pod {preemptor.uid}): queue {self.pod.queue} "
                    "was using more than its guarantee")
        return (f"preempted in queue {self.pod.queue} by pod {preemptor.uid} of higher priority "
                f"({preemptor.priority} > {self.pod.priority})")


@dataclass(frozen=True, slots=True)
class Plan:
    node: str
    victims: tuple[Victim, ...]

    def cost(self, now: float) -> tuple[int, int, int, float, str]:
        prios = [v.pod.priority for v in self.victims]
        lost = sum(max(0.0, now - v.pod.started_at) for v in self.victims)
        return (len(prios), max(prios, default=0), sum(prios), lost, self.node)


def _usage_without(usage: Mapping[str, Quota], taken: Iterable[Running]) -> dict[str, Quota]:
    out = dict(usage)
    for pod in taken:
        out[pod.queue] = out.get(pod.queue, Quota()) - pod.charge
    return out


def victim_reason(tree: QueueTree, usage: Mapping[str, Quota], preemptor: Preemptor, pod: Running,
            in_quota: bool) -> str | None:
    """Why `pod` may be taken for `preemptor` with the queues at `usage` (victims chosen so far removed), or
    None if it may not."""
    if not pod.preemptible or pod.uid == preemptor.uid:
        return None
    if pod.queue == preemptor.queue:
        return REASON_PRIORITY if pod.priority < preemptor.priority else None
    if not in_quota or pod.queue not in tree.specs:
        return None
    sub = tree.subtree_usage(usage)
    # The victim's queue, and its branch below the first ancestor it shares with the preemptor, must both
    # be borrowing on a dimension the victim holds: then the victim is (partly) borrowed capacity.
    mine = set(tree.chain(preemptor.queue))
    branch = pod.queue
    for name in tree.chain(pod.queue):
        if name in mine:
            break
        branch = name
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
