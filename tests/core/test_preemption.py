"""Victim choice for reclaim and priority preemption (gpupool.core.preemption)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.preemption import (
    REASON_PRIORITY,
    REASON_RECLAIM,
    Plan,
    Preemptor,
    Running,
    Victim,
    plan_preemption,
    victim_reason,
)
from gpupool.core.queues import Admitted, QueueSpec, QueueTree, Quota, admit


def g(n: float) -> Quota:
    return Quota(int(n * 1000), 0, 0)


TREE = QueueTree.build([QueueSpec("a", g(2)), QueueSpec("b", g(2))], capacity=g(4))
NODE_GPUS = {"n1": 2.0, "n2": 2.0}  # capacity per node in GPUs (a node-level stand-in for placement)


def fits_by_capacity(running: list[Running], need: float):  # type: ignore[no-untyped-def]
    def fits(node: str, victims: frozenset[str]) -> bool:
        used = sum(p.charge.gpu_milli for p in running if p.node == node and p.uid not in victims) / 1000
        return used + need <= NODE_GPUS[node]
    return fits


def usage_of(running: list[Running]) -> dict[str, Quota]:
    out: dict[str, Quota] = {}
    for p in running:
        out[p.queue] = out.get(p.queue, Quota()) + p.charge
    return out


def pod(uid: str, queue: str, node: str, gpus: float, priority: int = 0, started: float = 0.0) -> Running:
    return Running(uid, f"ns/{uid}", queue, node, priority, g(gpus), started)


def test_reclaim_takes_the_borrowed_pod_not_the_guaranteed_ones() -> None:
    # b borrowed: it runs 4 x 1 GPU (guarantee 2) filling both nodes; a (0 used) asks 1 GPU: in quota.
    running = [pod("b1", "b", "n1", 1, started=10), pod("b2", "b", "n1", 1, started=20),
               pod("b3", "b", "n2", 1, started=30), pod("b4", "b", "n2", 1, started=40)]
    plan = plan_preemption(TREE, usage_of(running), Preemptor("x", "a", 0, g(1)), running,
                           fits_by_capacity(running, 1), now=100)
    assert plan is not None and len(plan.victims) == 1
    victim = plan.victims[0]
    # One victim frees enough on either node; least run time lost: b4 ran 60 s (100-40), b3 70, b2 80, b1 90.
    assert victim.pod.uid == "b4" and victim.reason == REASON_RECLAIM and plan.node == "n2"


def test_never_reclaims_within_the_victims_guarantee() -> None:
    # b runs exactly its guarantee (2) and a borrowed 2: a's own pods are the only over-guarantee ones, and a
    # preemptor from b asking 1 more would itself be borrowing (3 > 2): nothing may be taken.
    running = [pod("a1", "a", "n1", 1), pod("a2", "a", "n1", 1), pod("b1", "b", "n2", 1), pod("b2", "b", "n2", 1)]
    plan = plan_preemption(TREE, usage_of(running), Preemptor("x", "b", 0, g(1)), running,
                           fits_by_capacity(running, 1), now=100)
    assert plan is None


def test_priority_preemption_stays_inside_the_queue_and_needs_strictly_lower_priority() -> None:
    running = [pod("a1", "a", "n1", 1, priority=5), pod("a2", "a", "n1", 1, priority=1),
               pod("b1", "b", "n2", 1, priority=0), pod("b2", "b", "n2", 1, priority=0)]
    # a uses its guarantee (2); a higher-priority a pod asks 1: in a's queue it can only displace lower ones.
    # Taking a2 (priority 1) leaves a at 1 + 1 = 2 (within guarantee) and frees n1.
    plan = plan_preemption(TREE, usage_of(running), Preemptor("x", "a", 3, g(1)), running,
                           fits_by_capacity(running, 1), now=100)
    assert plan is not None and [v.pod.uid for v in plan.victims] == ["a2"]
    assert plan.victims[0].reason == REASON_PRIORITY
    # At equal priority nobody is displaced.
    assert plan_preemption(TREE, usage_of(running), Preemptor("x", "a", 1, g(1)), running,
                           fits_by_capacity(running, 1), now=100) is None


def test_fewest_victims_wins_over_lower_priority() -> None:
    # n1: four half-GPU borrowed pods of b (priority 0); n2: two whole pods of b (priorities 7 and 8). b uses 4
    # of its guarantee 1, so all are borrowed. a asks 1 GPU: n1 needs two halves (2 victims), n2 one whole
    # pod: fewest victims first -> n2, and there the lower priority (7).
    tree = QueueTree.build([QueueSpec("a", g(2)), QueueSpec("b", g(1))], capacity=g(4))
    running = [pod(f"h{i}", "b", "n1", 0.5) for i in range(4)]
    running += [pod("w7", "b", "n2", 1, priority=7), pod("w8", "b", "n2", 1, priority=8)]
    plan = plan_preemption(tree, usage_of(running), Preemptor("x", "a", 0, g(1)), running,
                           fits_by_capacity(running, 1), now=100)
    assert plan is not None and plan.node == "n2" and [v.pod.uid for v in plan.victims] == ["w7"]


def test_unneeded_victims_are_given_back() -> None:
    # n1 (2 GPUs) holds b's small 0.25 (10 s lost, taken first) and big 1.5: 1.75 used. a asks 1 GPU:
    # without small, 1.5 + 1 = 2.5 > 2, so greedy also takes big; then small is not needed
    # (0.25 + 1 = 1.25 <= 2) and is given back. n2 holds one 2-GPU pod of priority 5 (costlier).
    tree = QueueTree.build([QueueSpec("a", g(2)), QueueSpec("b", g(0))], capacity=g(4))
    running = [pod("small", "b", "n1", 0.25, started=90), pod("big", "b", "n1", 1.5, started=0),
               pod("fill", "b", "n2", 2, priority=5, started=0)]
    plan = plan_preemption(tree, usage_of(running), Preemptor("x", "a", 0, g(1)), running,
                           fits_by_capacity(running, 1), now=100)
    assert plan is not None and plan.node == "n1" and [v.pod.uid for v in plan.victims] == ["big"]


def test_pods_a_disruption_budget_protects_are_not_taken() -> None:
    running = [pod("b1", "b", "n1", 1), pod("b2", "b", "n1", 1), pod("b3", "b", "n2", 1), pod("b4", "b", "n2", 1)]
    protected = [Running(p.uid, p.key, p.queue, p.node, p.priority, p.charge, p.started_at,
                         preemptible=p.uid not in {"b3", "b4"}) for p in running]
    plan = plan_preemption(TREE, usage_of(running), Preemptor("x", "a", 0, g(1)), protected,
                           fits_by_capacity(running, 1), now=100)
    assert plan is not None and plan.node == "n1"


def test_a_share_freed_by_several_pods_costs_each_of_them() -> None:
    # n1: a share of a's (1 GPU, priority 0) that only evicting two pods frees (a claim both use); n2: a's pod
    # of priority 1 (1 GPU). Both nodes are full (1 GPU each here); an a pod of priority 5 asks 1 GPU. One
    # victim either way, but n1's evicts two pods: fewest pods first -> n2, though its victim's priority is
    # higher. (Counting victims, not pods, took n1: priority 0 < 1.)
    gpus = {"n1": 1.0, "n2": 1.0}
    shared = Running("claim", "ns/claim", "a", "n1", 0, g(1), 0.0, pods=(("ns/s1", "s1"), ("ns/s2", "s2")))
    running = [shared, pod("p", "a", "n2", 1, priority=1)]

    def fits(node: str, victims: frozenset[str]) -> bool:
        return sum(r.charge.gpu_milli for r in running if r.node == node and r.uid not in victims) + 1000 \
            <= gpus[node] * 1000

    plan = plan_preemption(TREE, usage_of(running), Preemptor("x", "a", 5, g(1)), running, fits, now=100)
    assert plan is not None and plan.node == "n2" and [v.pod.uid for v in plan.victims] == ["p"]
    assert plan.cost(100)[0] == 1 and Plan("n1", (Victim(shared, REASON_PRIORITY),)).cost(100)[0] == 2
    assert shared.evicted == (("ns/s1", "s1"), ("ns/s2", "s2")) and running[1].evicted == (("ns/p", "p"),)


def test_a_preemptor_that_may_not_preempt_takes_nothing() -> None:
    # a runs all 4 GPUs (guarantee 2): an a pod of priority 3 takes by priority, a b pod (within its own
    # guarantee) by reclaim. With preemptionPolicy Never neither takes anything.
    running = [pod("a1", "a", "n1", 1, priority=5), pod("a2", "a", "n1", 1, priority=1),
               pod("a3", "a", "n2", 1, priority=0), pod("a4", "a", "n2", 1, priority=0)]
    usage = usage_of(running)
    assert plan_preemption(TREE, usage, Preemptor("x", "a", 3, g(1)), running, fits_by_capacity(running, 1),
                           now=100) is not None
    assert plan_preemption(TREE, usage, Preemptor("y", "b", 0, g(1)), running, fits_by_capacity(running, 1),
                           now=100) is not None
    for never in (Preemptor("x", "a", 3, g(1), preempts=False), Preemptor("y", "b", 0, g(1), preempts=False)):
        assert plan_preemption(TREE, usage, never, running, fits_by_capacity(running, 1), now=100) is None
        assert all(victim_reason(TREE, usage, never, r, True) is None for r in running)


def test_a_share_of_the_preemptors_own_pod_is_never_its_victim() -> None:
    # A claim the preemptor's pod already uses (shared with a lower-priority pod) is no victim for it.
    own = Running("claim", "ns/claim", "a", "n1", 0, g(1), 0.0, pods=(("ns/low", "low"), ("ns/x", "x")))
    assert victim_reason(TREE, {"a": g(1)}, Preemptor("x", "a", 5, g(1)), own, True) is None
    other = Running("claim", "ns/claim", "a", "n1", 0, g(1), 0.0, pods=(("ns/low", "low"),))
    assert victim_reason(TREE, {"a": g(1)}, Preemptor("x", "a", 5, g(1)), other, True) == REASON_PRIORITY


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from([0.25, 0.5, 1.0]), st.integers(0, 3)),
                min_size=1, max_size=30))
def test_no_reclaim_is_ever_answered_by_a_reclaim_back(arrivals: list[tuple[str, float, int]]) -> None:
    """Pods arrive; each that cannot start tries to preempt. After every eviction for reclaim, the victim's
    queue is never below its guarantee by more than the victim, and no pod is evicted twice; capacity holds."""
    running: list[Running] = []
    evicted: set[str] = set()
    for i, (queue, size, prio) in enumerate(arrivals):
        uid = f"p{i}"
        charge = g(size)
        usage = usage_of(running)
        fits = fits_by_capacity(running, size)
        nodes = [n for n in sorted(NODE_GPUS) if fits(n, frozenset())]
        if isinstance(admit(TREE, usage, queue, charge), Admitted) and nodes:
            running.append(pod(uid, queue, nodes[0], size, prio, float(i)))
            continue
        plan = plan_preemption(TREE, usage, Preemptor(uid, queue, prio, charge), running, fits, now=float(i))
        if plan is None:
            continue
        for victim in plan.victims:
            assert victim.pod.uid not in evicted
            evicted.add(victim.pod.uid)
            if victim.reason == REASON_RECLAIM:
                before = usage[victim.pod.queue]
                # The victim's queue was borrowing when the victim was taken.
                assert not before.fits_in(TREE.specs[victim.pod.queue].guaranteed)
                assert (usage.get(queue, Quota()) + charge).fits_in(TREE.specs[queue].guaranteed)
        gone = {v.pod.uid for v in plan.victims}
        running = [p for p in running if p.uid not in gone]
        running.append(pod(uid, queue, plan.node, size, prio, float(i)))
        for node, cap in NODE_GPUS.items():
            assert sum(p.charge.gpu_milli for p in running if p.node == node) <= cap * 1000
