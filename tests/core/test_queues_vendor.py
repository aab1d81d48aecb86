"""Per-vendor maxima of team queues (QueueSpec.vendor_maximum): each vendor's cards counted on their own where
the queue says so, and nothing changed where it does not."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.model import GPU, Allocation, GPUGrant, GPURequest, Node
from gpupool.core.queues import (
    Admitted,
    QueueSpec,
    QueueTree,
    Quota,
    Refused,
    admit,
    card_memory,
    charge_of_allocation,
    charge_of_request,
)
from gpupool.core.vendors import AMD, ASCEND, NVIDIA

NODES = [
    Node("n", 64_000, 256_000, tuple(GPU(f"n-g{j}", j, "A100-80GB", 81920) for j in range(4))),
    Node("a", 64_000, 256_000, tuple(GPU(f"a-g{j}", j, "MI300X", 196608, vendor=AMD) for j in range(4))),
]
CARDS = card_memory(NODES)
CLUSTER = Quota(8000, 4 * 81920 + 4 * 196608, 800)  # the eight cards: what queues may borrow


def whole_on(node: str, index: int, key: str) -> Quota:
    """The charge of a pod holding one whole GPU `index` of `node`."""
    mib = CARDS[f"{node}-g{index}"]
    return charge_of_allocation(Allocation(key, node, (GPUGrant(f"{node}-g{index}", index, 1000, mib),)), CARDS)


def amd_at_most_two() -> QueueTree:
    return QueueTree.build([QueueSpec("team", vendor_maximum=((AMD, 2000),))], capacity=CLUSTER)


def test_card_memory_knows_each_cards_vendor() -> None:
    assert CARDS["a-g0"] == 196608 and CARDS.vendor == {**{f"n-g{j}": NVIDIA for j in range(4)},
                                                        **{f"a-g{j}": AMD for j in range(4)}}


def test_a_charge_is_split_by_the_vendor_of_its_cards() -> None:
    both = Allocation("p", "x", (GPUGrant("n-g0", 0, 1000, 81920), GPUGrant("a-g1", 1, 250, 49152)))
    charge = charge_of_allocation(both, CARDS)
    # n-g0 whole: 1000; a-g1: max(250, 49152/196608 = 250) = 250.
    assert charge.by_vendor == ((AMD, 250), (NVIDIA, 1000))
    assert charge == Quota(1250, 81920 + 49152, 125)  # the three dimensions as before
    # A plain mapping of memory (no vendors) charges as before, with no split.
    assert charge_of_allocation(both, dict(CARDS)).by_vendor == ()


def test_a_pending_pods_charge_is_on_the_vendor_its_runtime_names() -> None:
    assert charge_of_request(GPURequest(2, runtime="rocm"), 196608).by_vendor == ((AMD, 2000),)
    assert charge_of_request(GPURequest(1, runtime="cann"), 65536).by_vendor == ((ASCEND, 1000),)
    assert charge_of_request(GPURequest(1, runtime="any"), 65536).by_vendor == ()
    assert charge_of_request(GPURequest(1), 65536).by_vendor == ()


def test_an_amd_maximum_of_two_admits_a_third_nvidia_pod_but_not_a_third_amd_one() -> None:
    tree = amd_at_most_two()
    usage = {"team": whole_on("a", 0, "p1") + whole_on("a", 1, "p2") + whole_on("n", 0, "p3")
             + whole_on("n", 1, "p4")}
    assert usage["team"].by_vendor == ((AMD, 2000), (NVIDIA, 2000))
    assert admit(tree, usage, "team", whole_on("n", 2, "p5")) == Admitted(borrowing=True)
    third_amd = admit(tree, usage, "team", whole_on("a", 2, "p6"))
    assert third_amd == Refused("queue team: 3 of 2 amd GPUs maximum", "team", final=True)
    # Before placement, a rocm pod is refused by its runtime alone; one that says nothing is not (yet).
    assert isinstance(admit(tree, usage, "team", charge_of_request(GPURequest(1, runtime="rocm"), 196608)), Refused)
    assert isinstance(admit(tree, usage, "team", charge_of_request(GPURequest(1), 196608)), Admitted)


def test_a_share_counts_its_fraction_against_the_vendor_maximum() -> None:
    tree = QueueTree.build([QueueSpec("team", vendor_maximum=((AMD, 1500),))], capacity=CLUSTER)
    usage = {"team": whole_on("a", 0, "p1")}
    half = charge_of_allocation(Allocation("q", "a", (GPUGrant("a-g1", 1, 500, 98304),)), CARDS)
    assert admit(tree, usage, "team", half) == Admitted(borrowing=True)  # 1.5 of 1.5
    assert isinstance(admit(tree, {"team": usage["team"] + half}, "team", half), Refused)  # 2 of 1.5


def test_a_parents_vendor_maximum_holds_its_whole_subtree() -> None:
    tree = QueueTree.build([QueueSpec("org", vendor_maximum=((AMD, 2000),)), QueueSpec("t1", parent="org"),
                            QueueSpec("t2", parent="org")], capacity=CLUSTER)
    usage = {"t1": whole_on("a", 0, "p1"), "t2": whole_on("a", 1, "p2")}
    assert admit(tree, usage, "t1", whole_on("a", 2, "p3")) == Refused("queue org: 3 of 2 amd GPUs maximum", "org")


def test_a_negative_vendor_maximum_is_a_config_problem() -> None:
    try:
        QueueTree.build([QueueSpec("team", vendor_maximum=((AMD, -1),))])
    except ValueError as e:
        assert "queue 'team': negative maximum for amd GPUs" in str(e)
    else:
        raise AssertionError("accepted a negative maximum")


def test_quota_arithmetic_keeps_the_split() -> None:
    a = Quota(3000, 0, 0, ((AMD, 1000), (NVIDIA, 2000)))
    b = Quota(1000, 0, 0, ((NVIDIA, 1000),))
    assert (a - b).by_vendor == ((AMD, 1000), (NVIDIA, 1000))
    assert (b - a).positive().by_vendor == ()
    assert (a - a).by_vendor == () and (a - a).is_zero()
    assert b.elementwise_max(a).by_vendor == ((AMD, 1000), (NVIDIA, 2000))


grants = st.lists(st.tuples(st.sampled_from(["n", "a"]), st.integers(0, 3), st.sampled_from([250, 500, 1000])),
                  min_size=0, max_size=8)


@settings(max_examples=200, deadline=None)
@given(grants, st.sampled_from(["n", "a"]), st.integers(0, 3), st.sampled_from([250, 1000]))
def test_without_vendor_maxima_every_decision_is_the_one_without_the_split(held: list[tuple[str, int, int]],
                                                                           node: str, index: int, milli: int) -> None:
    """The split changes nothing where no queue sets a vendor maximum: the same admissions as charges
    without vendors, for the same usage."""
    tree = QueueTree.build([QueueSpec("team", Quota(2000, 10**9, 10**9), Quota(5000, 10**9, 10**9)),
                            QueueSpec("other", Quota(2000, 10**9, 10**9))], capacity=Quota(8000, 10**9, 10**9))
    plain = dict(CARDS)

    def charge(cards: dict[str, int], n: str, j: int, m: int, key: str) -> Quota:
        uuid = f"{n}-g{j}"
        return charge_of_allocation(Allocation(key, n, (GPUGrant(uuid, j, m, cards[uuid] * m // 1000),)), cards)

    with_split = sum((charge(CARDS, n, j, m, f"h{k}") for k, (n, j, m) in enumerate(held)), Quota())
    without = sum((charge(plain, n, j, m, f"h{k}") for k, (n, j, m) in enumerate(held)), Quota())
    assert with_split == without
    new_split, new_plain = charge(CARDS, node, index, milli, "new"), charge(plain, node, index, milli, "new")
    assert admit(tree, {"team": with_split}, "team", new_split) == admit(tree, {"team": without}, "team", new_plain)


@settings(max_examples=200, deadline=None)
@given(grants, st.sampled_from(["n", "a"]), st.integers(0, 3), st.sampled_from([250, 1000]), st.integers(0, 4000))
def test_a_vendor_maximum_refuses_exactly_what_passes_it_on_that_vendor(held: list[tuple[str, int, int]], node: str,
                                                                     index: int, milli: int, most: int) -> None:
    roomy = Quota(10**6, 10**9, 10**6)  # nothing but the vendor maximum can refuse
    tree = QueueTree.build([QueueSpec("team", vendor_maximum=((AMD, most),))], capacity=roomy)
    usage = sum((whole_or_share(n, j, m, f"h{k}") for k, (n, j, m) in enumerate(held)), Quota())
    new = whole_or_share(node, index, milli, "new")
    amd_after = sum(m for n, _, m in held if n == "a") + (milli if node == "a" else 0)
    refused = node == "a" and amd_after > most
    assert isinstance(admit(tree, {"team": usage}, "team", new), Refused) == refused


def whole_or_share(node: str, index: int, milli: int, key: str) -> Quota:
    uuid = f"{node}-g{index}"
    mib = CARDS[uuid] * milli // 1000
    return charge_of_allocation(Allocation(key, node, (GPUGrant(uuid, index, milli, mib),)), CARDS)
