"""Queue admission: guarantee, maximum, borrowing within a cohort and a hierarchy (gpupool.core.queues)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.core.model import Allocation, GPUGrant, GPURequest
from gpupool.core.queues import (
    NO_LIMIT,
    Admitted,
    QueueConfigError,
    QueueSpec,
    QueueTree,
    Quota,
    Refused,
    admit,
    charge_of_allocation,
    charge_of_request,
    statuses,
)


def gpus(n: float) -> Quota:
    """n whole GPUs of 80 GiB: n GPUs, n x 80 GiB, n x 100 % cores."""
    return Quota(int(n * 1000), int(n * 81920), int(n * 100))


def two_teams(*, a_lends: bool = True, b_lends: bool = True, a_max: Quota = NO_LIMIT) -> QueueTree:
    return QueueTree.build(
        [QueueSpec("team-a", gpus(2), a_max, lend=a_lends), QueueSpec("team-b", gpus(2), lend=b_lends)],
        capacity=gpus(4),
    )


def test_charge_counts_every_gpu_and_the_larger_fraction() -> None:
    # 30 % compute and 40 GiB of an 80 GiB card: memory is the larger fraction, 40960/81920 = 500 milli.
    share = GPURequest(count=1, milli=300, memory_mib=40960)
    assert charge_of_request(share, 81920) == Quota(500, 40960, 30)
    # Two whole GPUs of 80 GiB: 2000 milli, 2 x 81920 MiB, 200 %.
    assert charge_of_request(GPURequest(count=2), 81920) == Quota(2000, 163840, 200)
    # A memory-only share (1 milli of compute) of 10 GiB on an 80 GiB card: ceil(10240*1000/81920) = 125.
    assert charge_of_request(GPURequest(count=1, milli=1, memory_mib=10240), 81920) == Quota(125, 10240, 0)
    assert charge_of_request(GPURequest(count=0), 81920) == Quota()
    allocation = Allocation("ns/p", "n1", (GPUGrant("u0", 0, 250, 20480), GPUGrant("u1", 1, 250, 20480)))
    # Each grant: max(250, 20480/81920 = 250) = 250 milli; two of them.
    assert charge_of_allocation(allocation, {"u0": 81920, "u1": 81920}) == Quota(500, 40960, 50)


def test_within_guarantee_is_admitted_even_when_others_borrowed_everything() -> None:
    tree = two_teams()
    assert admit(tree, {"team-b": gpus(4)}, "team-a", gpus(1)) == Admitted(borrowing=False)


def test_borrowing_idle_guarantee_of_a_lending_sibling() -> None:
    # a uses 2 (its guarantee) and asks 1 more: 3 > 2 borrows; cohort: a 3 + b 0 = 3 <= capacity 4.
    assert admit(two_teams(), {"team-a": gpus(2)}, "team-a", gpus(1)) == Admitted(borrowing=True)


def test_a_sibling_that_does_not_lend_keeps_its_guarantee() -> None:
    # b lends nothing: it counts max(0, 2) = 2, so a 3 + 2 = 5 > 4.
    decision = admit(two_teams(b_lends=False), {"team-a": gpus(2)}, "team-a", gpus(1))
    assert decision == Refused("queue team-a: 3 of 2 GPUs guaranteed, cannot borrow: cohort full", "team-a",
                               final=False)


def test_maximum_is_final() -> None:
    decision = admit(two_teams(a_max=gpus(2.5)), {"team-a": gpus(2)}, "team-a", gpus(1))
    assert decision == Refused("queue team-a: 3 of 2.5 GPUs maximum", "team-a", final=True)


def test_borrowing_disabled() -> None:
    tree = QueueTree.build([QueueSpec("a", gpus(1), borrow=False), QueueSpec("b", gpus(3))])
    decision = admit(tree, {"a": gpus(1)}, "a", gpus(0.5))
    assert isinstance(decision, Refused) and decision.reason.endswith("cannot borrow: borrowing disabled")
    assert decision.reason.startswith("queue a: 1.5 of 1 GPUs guaranteed")


def test_cohort_full_when_everyone_uses_everything() -> None:
    # a 2 + b 2 = 4 = capacity; a asks 0.5 more: 4.5 > 4.
    decision = admit(two_teams(), {"team-a": gpus(2), "team-b": gpus(2)}, "team-a", gpus(0.5))
    assert decision == Refused("queue team-a: 2.5 of 2 GPUs guaranteed, cannot borrow: cohort full", "team-a",
                               final=False)


def hierarchy() -> QueueTree:
    return QueueTree.build(
        [QueueSpec("org", gpus(4)), QueueSpec("t1", gpus(2), parent="org"), QueueSpec("t2", gpus(2), parent="org"),
         QueueSpec("other", gpus(4))],
        capacity=gpus(8),
    )


def test_hierarchy_borrows_inside_the_parent_first() -> None:
    # t1 2 -> 3 (> 2): siblings under org: 3 + 0 = 3 <= org's 4.
    assert admit(hierarchy(), {"t1": gpus(2)}, "t1", gpus(1)) == Admitted(borrowing=True)


def test_hierarchy_borrows_from_the_next_level_when_the_parent_is_past_its_guarantee() -> None:
    # t1 4 -> 5: under org 5 > 4, and org itself (5) is past its 4, so org borrows at the top: org 5 + other 0
    # = 5 <= 8.
    assert admit(hierarchy(), {"t1": gpus(4)}, "t1", gpus(1)) == Admitted(borrowing=True)
    # With other using its whole guarantee: org 5 + other 4 = 9 > 8.
    decision = admit(hierarchy(), {"t1": gpus(4), "other": gpus(4)}, "t1", gpus(1))
    assert decision == Refused("queue org: 5 of 4 GPUs guaranteed, cannot borrow: cohort full", "org", final=False)


def test_non_lending_sibling_blocks_inside_the_parent() -> None:
    tree = QueueTree.build(
        [QueueSpec("org", gpus(4)), QueueSpec("t1", gpus(2), parent="org"),
         QueueSpec("t2", gpus(2), parent="org", lend=False)],
        capacity=gpus(8),
    )
    # t1 2 -> 3; t2 counts 2 (reserved): 5 > 4, while org's usage 3 is within its 4.
    decision = admit(tree, {"t1": gpus(2)}, "t1", gpus(1))
    assert decision == Refused("queue t1: 3 of 2 GPUs guaranteed, cannot borrow: queue org full", "t1", final=False)


def test_unknown_and_inner_queues_are_refused() -> None:
    assert admit(hierarchy(), {}, "nope", gpus(1)) == Refused("queue nope does not exist", "nope")
    decision = admit(hierarchy(), {}, "org", gpus(1))
    assert isinstance(decision, Refused) and "leaf queues only" in decision.reason


def test_bad_trees_list_every_problem() -> None:
    with pytest.raises(QueueConfigError) as err:
        QueueTree.build([
            QueueSpec("a", gpus(2), maximum=gpus(1)),
            QueueSpec("b", gpus(1), parent="ghost"),
            QueueSpec("p", gpus(1)),
            QueueSpec("c", gpus(2), parent="p"),
        ])
    text = str(err.value)
    assert "queue 'a': guarantee above maximum" in text
    assert "parent 'ghost' does not exist" in text
    assert "queue 'p': its children are guaranteed more than it is" in text
    with pytest.raises(QueueConfigError, match="cycle"):
        QueueTree.build([QueueSpec("x", parent="y"), QueueSpec("y", parent="x")])


def test_status_shows_borrowed_and_lent() -> None:
    rows = {s.name: s for s in statuses(two_teams(), {"team-a": gpus(3), "team-b": gpus(0.5)}, {"team-b": 2})}
    assert rows["team-a"].borrowed == gpus(1) and rows["team-a"].lent == Quota()
    assert rows["team-b"].lent == gpus(1.5) and rows["team-b"].pending == 2


@given(
    st.lists(st.tuples(st.sampled_from(["team-a", "team-b"]), st.integers(1, 1500)), max_size=40),
    st.booleans(),
    st.booleans(),
)
def test_admitted_usage_never_passes_capacity_nor_reserved_guarantees(
    asks: list[tuple[str, int]], a_lends: bool, b_lends: bool
) -> None:
    """Admitting pods one by one: the cohort never passes capacity, and a queue that does not lend always
    keeps room for its own guarantee (others' borrowing stays within capacity minus that guarantee)."""
    tree = two_teams(a_lends=a_lends, b_lends=b_lends)
    usage = {"team-a": Quota(), "team-b": Quota()}
    for queue, milli in asks:
        charge = Quota(milli, 0, 0)
        decision = admit(tree, usage, queue, charge)
        if isinstance(decision, Admitted):
            usage[queue] = usage[queue] + charge
            other = "team-b" if queue == "team-a" else "team-a"
            guaranteed = tree.specs[queue].guaranteed
            if decision.borrowing:
                assert not usage[queue].fits_in(guaranteed)
                reserve = Quota() if tree.specs[other].lend else tree.specs[other].guaranteed
                assert (usage[queue] + usage[other].elementwise_max(reserve)).fits_in(gpus(4))
            else:
                assert usage[queue].fits_in(guaranteed)


def test_only_the_declared_dimensions_count() -> None:
    # team-a declares GPUs only: a whole 80 GiB GPU is within its 1-GPU guarantee whatever its memory.
    tree = QueueTree.build([QueueSpec("team-a", Quota(1000, 0, 0), dims=frozenset({"gpu_milli"})),
                            QueueSpec("team-b", Quota(1000, 0, 0), dims=frozenset({"gpu_milli"}))])
    assert admit(tree, {}, "team-a", gpus(1)) == Admitted(borrowing=False)
    # A second GPU borrows team-b's idle one (a 1 + 1 = 2 <= the two guarantees).
    assert admit(tree, {"team-a": gpus(1)}, "team-a", gpus(1)) == Admitted(borrowing=True)
    assert statuses(tree, {"team-a": gpus(2)}, {})[0].borrowed == Quota(1000, 0, 0)
