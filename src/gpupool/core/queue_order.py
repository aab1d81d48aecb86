"""In which order pending pods are tried: `fifo` (arrival), `priority` (higher first, then arrival) or `fair`
(the queue furthest below its weighted share first, then priority, then arrival).

`fair` ranks a queue by its dominant share: for each dimension, usage divided by the queue's guarantee (a
queue with no guarantee in a dimension it uses ranks after every queue that has one), the largest of them,
divided by the queue's weight. A queue using nothing ranks first. Ties keep arrival order, so the order is
deterministic for a given state. Pure: used by the timeline replay and by the scheduler's queue views.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpupool.core.queues import DIMENSIONS, QueueTree, Quota

ORDERS = ("fifo", "priority", "fair")


@dataclass(frozen=True, slots=True)
class Waiting:
    key: str
    queue: str
    priority: int
    arrived: float


def dominant_share(tree: QueueTree, usage: Mapping[str, Quota], queue: str) -> float:
    spec = tree.specs.get(queue)
    if spec is None:
        return float("inf")
    used = tree.subtree_usage(usage)[queue].values()
    share = 0.0
    for d, u, g in zip(DIMENSIONS, used, spec.guaranteed.values(), strict=True):
        if u > 0 and d in spec.dims:
            share = max(share, u / g if g > 0 else float("inf"))
    if share == 0.0:
        return 0.0
    return share / spec.weight if spec.weight > 0 else float("inf")


def order(pending: Iterable[Waiting], how: str, tree: QueueTree | None = None,
          usage: Mapping[str, Quota] | None = None) -> Sequence[Waiting]:
    items = list(pending)
    if how == "fifo":
        return sorted(items, key=lambda w: (w.arrived, w.key))
    if how == "priority":
        return sorted(items, key=lambda w: (-w.priority, w.arrived, w.key))
    if how == "fair":
        if tree is None or usage is None:
            raise ValueError("the fair order needs the queue tree and its usage")
        shares = {q: dominant_share(tree, usage, q) for q in {w.queue for w in items}}
        return sorted(items, key=lambda w: (shares[w.queue], -w.priority, w.arrived, w.key))
    raise ValueError(f"unknown order {how!r}: use one of {', '.join(ORDERS)}")
