"""Pending order: fifo, priority, fair (gpupool.core.queue_order)."""

import pytest

from gpupool.core.queue_order import Waiting, dominant_share, order
from gpupool.core.queues import QueueSpec, QueueTree, Quota

TREE = QueueTree.build([QueueSpec("a", Quota(2000, 0, 200)), QueueSpec("b", Quota(1000, 0, 100), weight=2),
                        QueueSpec("c", Quota(0, 0, 0))])
PENDING = [Waiting("p1", "a", 0, 1.0), Waiting("p2", "b", 5, 2.0), Waiting("p3", "a", 9, 3.0),
           Waiting("p4", "c", 0, 0.5)]


def test_fifo_and_priority() -> None:
    assert [w.key for w in order(PENDING, "fifo")] == ["p4", "p1", "p2", "p3"]
    assert [w.key for w in order(PENDING, "priority")] == ["p3", "p2", "p4", "p1"]


def test_dominant_share_by_hand() -> None:
    usage = {"a": Quota(1000, 0, 150), "b": Quota(1500, 0, 0), "c": Quota(100, 0, 0)}
    # a: max(1000/2000, 150/200) = 0.75, weight 1 -> 0.75.
    assert dominant_share(TREE, usage, "a") == pytest.approx(0.75)
    # b: 1500/1000 = 1.5, weight 2 -> 0.75.
    assert dominant_share(TREE, usage, "b") == pytest.approx(0.75)
    # c uses GPUs with no guarantee: after everyone who has one.
    assert dominant_share(TREE, usage, "c") == float("inf")
    assert dominant_share(TREE, {}, "c") == 0.0


def test_fair_serves_the_queue_furthest_below_its_share() -> None:
    usage = {"a": Quota(1000, 0, 0), "b": Quota(200, 0, 0), "c": Quota(100, 0, 0)}
    # shares: a 0.5, b 0.2/2 = 0.1, c inf -> b first, then a (p3 priority 9 before p1), then c.
    assert [w.key for w in order(PENDING, "fair", TREE, usage)] == ["p2", "p3", "p1", "p4"]


def test_unknown_order_is_named() -> None:
    with pytest.raises(ValueError, match="unknown order 'lifo'"):
        order(PENDING, "lifo")
