"""Time-sharing instead of eviction: squeezing a borrowed share's compute before evicting anything
(gpupool.core.preemption.plan_squeeze). One node `n1` with one 80 GiB GPU (81,920 MiB, 1,000 milli)."""

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.preemption import (
    Preemptor,
    Running,
    Share,
    plan_preemption,
    plan_squeeze,
)
from gpupool.core.queues import Admitted, QueueSpec, QueueTree, Quota, admit, charge_of_share

CARD = 81920
HALF = Quota(500, 40960, 50)
TREE = QueueTree.build([QueueSpec("a", HALF), QueueSpec("b", HALF)], capacity=Quota(1000, CARD, 100))


def share_pod(uid: str, queue: str, milli: int, memory: int, squeezable: bool = True, started: float = 0.0,
              priority: int = 0) -> Running:
    share = Share(milli, memory, CARD)
    return Running(uid, f"ns/{uid}", queue, "n1", priority, charge_of_share(milli, memory, CARD), started,
                   squeezable=squeezable, shares=(share,))


def usage_of(running: list[Running]) -> dict[str, Quota]:
    out: dict[str, Quota] = {}
    for p in running:
        out[p.queue] = out.get(p.queue, Quota()) + p.charge
    return out


def gpu(running: list[Running], need_milli: int, need_memory: int):  # type: ignore[no-untyped-def]
    """The one GPU's fit: compute and memory of the pods (squeezed ones at their squeezed compute)."""
    def fits_squeezed(node: str, squeezed: Mapping[str, int], gone: frozenset[str] = frozenset()) -> bool:
        left = [p for p in running if p.uid not in gone]
        milli = sum(squeezed.get(p.uid, p.milli) for p in left)
        memory = sum(s.memory_mib for p in left for s in p.shares)
        return milli + need_milli <= 1000 and memory + need_memory <= CARD

    def fits(node: str, victims: frozenset[str]) -> bool:
        return fits_squeezed(node, {}, victims)
    return fits_squeezed, fits


def preemptor(milli: int, memory: int, queue: str = "a") -> Preemptor:
    return Preemptor("x", queue, 0, charge_of_share(milli, memory, CARD))


def test_a_borrowed_share_is_squeezed_only_as_far_as_the_owner_needs() -> None:
    # b1: 80 % / 16 GiB, charged 800 milli (memory fraction 16384/81920 = 200 < 800), 80 cores: b borrows 300
    # milli and 30 cores beyond its 500 / 50. a asks 30 % / 8 GiB (300 milli, within its guarantee); free
    # compute 200 < 300, memory 64 GiB free. b1 may go down to b's guarantee (500), the fit needs
    # 1000 - m >= 300, i.e. m <= 700: squeezed to 700, not evicted.
    running = [share_pod("b1", "b", 800, 16384)]
    fits_squeezed, _ = gpu(running, 300, 8192)
    plan = plan_squeeze(TREE, usage_of(running), preemptor(300, 8192), running, fits_squeezed, now=100)
    assert plan is not None and plan.node == "n1"
    assert [(s.pod.uid, s.milli) for s in plan.squeezes] == [("b1", 700)]
    assert "from 80 % to 70 %" in plan.squeezes[0].message(preemptor(300, 8192))


def test_memory_cannot_be_squeezed_so_reclaim_falls_back_to_eviction() -> None:
    # a asks 30 % / 40 GiB (charged 500 milli: its guarantee): b1 holds 48 GiB of the 80, so 32 GiB are free
    # whatever b1's compute: no squeeze makes room. Eviction does: b1 (800 milli) is borrowed capacity.
    running = [share_pod("b1", "b", 800, 49152)]
    fits_squeezed, fits = gpu(running, 300, 40960)
    usage = usage_of(running)
    assert plan_squeeze(TREE, usage, preemptor(300, 40960), running, fits_squeezed, now=100) is None
    evict = plan_preemption(TREE, usage, preemptor(300, 40960), running, fits, now=100)
    assert evict is not None and [v.pod.uid for v in evict.victims] == ["b1"]


def test_a_squeeze_never_takes_the_borrowers_guarantee() -> None:
    # a asks 60 %: 1000 - m >= 600 needs b1 at 400 or less, below b's guaranteed 50 % (500): no squeeze.
    running = [share_pod("b1", "b", 800, 8192)]
    fits_squeezed, _ = gpu(running, 600, 8192)
    assert plan_squeeze(TREE, usage_of(running), preemptor(600, 8192), running, fits_squeezed, now=100) is None


def test_pods_that_cannot_be_squeezed_are_left_to_eviction() -> None:
    # b1 is not served by the interception library (or opted out): nothing to squeeze; b2 (squeezable,
    # 40 %) is within b's guarantee once b1 is counted? b = 400 + 400 = 800 milli, 300 borrowed: b2 may be
    # squeezed to 400 - 300 = 100 (the floor, 10 %) and the fit needs 1000 - 400 - m >= 300: m <= 300.
    running = [share_pod("b1", "b", 400, 8192, squeezable=False), share_pod("b2", "b", 400, 8192)]
    fits_squeezed, _ = gpu(running, 300, 8192)
    plan = plan_squeeze(TREE, usage_of(running), preemptor(300, 8192), running, fits_squeezed, now=100)
    assert plan is not None and [(s.pod.uid, s.milli) for s in plan.squeezes] == [("b2", 300)]


def test_only_a_reclaim_squeezes_never_a_priority_preemption_or_a_borrower() -> None:
    running = [share_pod("b1", "b", 800, 8192, priority=0)]
    fits_squeezed, _ = gpu(running, 300, 8192)
    # A higher-priority pod of b itself: b is over its guarantee, so it is not a reclaim.
    high = Preemptor("x", "b", 10, charge_of_share(300, 8192, CARD))
    assert plan_squeeze(TREE, usage_of(running), high, running, fits_squeezed, now=100) is None


def test_the_fewest_pods_are_squeezed() -> None:
    # b1 30 % and b2 50 % (b at 800, 300 borrowed); a asks 40 %: free 200, 200 more needed. Either alone can
    # give 200 (b then at 600 >= 500), so one pod is squeezed, not both: b1, which lost the least run time
    # (100 - 50 = 50 s against 90 s), from 300 to 100 (1000 - 100 - 500 = 400).
    running = [share_pod("b1", "b", 300, 4096, started=50), share_pod("b2", "b", 500, 4096, started=10)]
    fits_squeezed, _ = gpu(running, 400, 4096)
    plan = plan_squeeze(TREE, usage_of(running), preemptor(400, 4096), running, fits_squeezed, now=100)
    assert plan is not None and [(s.pod.uid, s.milli) for s in plan.squeezes] == [("b1", 100)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(150, 900), st.integers(0, 20480), st.booleans()), min_size=1, max_size=4),
       st.integers(50, 500), st.integers(0, 20480), st.integers(0, 1000))
def test_a_squeeze_plan_admits_and_fits_the_owner_and_keeps_every_borrower_at_its_guarantee(
        pods: list[tuple[int, int, bool]], need: int, memory: int, guarantee: int) -> None:
    b_spec = QueueSpec("b", Quota(guarantee, 0, guarantee // 10), dims=frozenset({"gpu_milli", "cores"}))
    tree = QueueTree.build([QueueSpec("a", Quota(1000, CARD, 100)), b_spec], capacity=Quota(2000, 2 * CARD, 200))
    running = [share_pod(f"b{i}", "b", m, mem, squeezable=sq, started=i) for i, (m, mem, sq) in enumerate(pods)]
    fits_squeezed, _ = gpu(running, need, memory)
    usage = usage_of(running)
    owner = preemptor(need, memory)
    plan = plan_squeeze(tree, usage, owner, running, fits_squeezed, now=100)
    if plan is None:
        return
    squeezed = {s.pod.uid: s.milli for s in plan.squeezes}
    assert fits_squeezed("n1", squeezed)
    after = dict(usage)
    for s in plan.squeezes:
        assert s.pod.squeezable and 100 <= s.milli < s.pod.milli
        after["b"] = after["b"] - s.pod.charge + s.pod.charge_at(s.milli)
    assert isinstance(admit(tree, after, "a", owner.charge), Admitted)
    b = tree.specs["b"]
    # b lost only what it borrowed: in compute it keeps min(its usage before, its guarantee)
    assert after["b"].gpu_milli >= min(usage["b"].gpu_milli, b.guaranteed.gpu_milli)
    assert after["b"].cores >= min(usage["b"].cores, b.guaranteed.cores)
