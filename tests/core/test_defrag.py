"""gpupool.core.defrag: the fragmentation figure, hand-computed rounds, the budget, and invariants of a round."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.core.defrag import DefragPlan, apply_defrag, fragmentation, plan_defrag
from gpupool.core.frag import WorkloadArrays
from gpupool.core.model import Allocation, PodRequest
from gpupool.core.moves import MovableShares
from gpupool.core.policy import TaskShape
from gpupool.core.state import ClusterState
from tests.core.helpers import node, share

GPU_MEM = 40_960  # helpers.node's card


def put(state: ClusterState, pod: PodRequest, node_name: str, gpu: int) -> None:
    i = state.index[node_name]
    assert state.allocate(pod, Allocation(pod.key, node_name, state.grants_for(i, pod, (gpu,)))) is None


def mib(milli: int) -> int:
    return GPU_MEM * milli // 1000


def scene(pods: dict[str, tuple[int, str, int]], nodes: dict[str, int]) -> tuple[ClusterState, dict[str, PodRequest]]:
    state = ClusterState([node(n, g) for n, g in nodes.items()])
    movable = {}
    for key, (milli, n, j) in pods.items():
        pod = share(key, milli)
        put(state, pod, n, j)
        movable[key] = pod
    return state, movable


def test_fragmentation_is_the_free_compute_off_whole_free_gpus() -> None:
    # a: g0 holds 0.3 (0.7 free), g1 empty; b: g0 holds 0.6 (0.4 free). Free 700 + 1000 + 400 = 2100, of which
    # 1100 is off a whole free GPU: 1100 / 2100.
    state, _ = scene({"s1": (300, "a", 0), "s2": (600, "b", 0)}, {"a": 2, "b": 1})
    assert fragmentation(state) == pytest.approx(1100 / 2100)
    # only b usable: all of its 400 free is fragmented; a GPU marked unhealthy does not count either
    usable = np.zeros_like(state.gpu_healthy)
    usable[state.index["b"], 0] = True
    assert fragmentation(state, usable) == 1.0
    state.gpu_healthy[state.index["a"], 1] = False
    assert fragmentation(state) == pytest.approx(1.0)
    assert fragmentation(ClusterState([node("c", 1)])) == 0.0  # nothing fragmented
    full, _ = scene({"w": (1000, "d", 0)}, {"d": 1})
    assert fragmentation(full) == 0.0  # nothing free at all


def test_a_round_empties_the_cheapest_gpu_into_the_fullest_hole() -> None:
    # a: g0 0.2 (s1), g1 0.3 (s2); b: g0 0.6 (s3), g1 0.7 (s4). Sources by memory moved: a/g0 (0.2), a/g1 (0.3),
    # b/g0, b/g1. s1 (0.2) goes to the fuller GPU left with the least free: b/g1 (0.3 free -> 0.1). Then s2
    # (0.3): fuller GPUs a... b/g0 (0.4 free -> 0.1) is the tightest (b/g1 has only 0.1 left). b/g0 and b/g1
    # are now full beyond what s3 (0.6) or s4 (0.7) could find: the round frees a/g0 and a/g1, 2 moves.
    state, movable = scene({"s1": (200, "a", 0), "s2": (300, "a", 1), "s3": (600, "b", 0), "s4": (700, "b", 1)},
                           {"a": 2, "b": 2})
    plan = plan_defrag(state, movable, max_moves=8)
    assert [(m.key, m.source, m.target) for m in plan.moves] == [("s1", ("a", 0), ("b", 1)),
                                                                 ("s2", ("a", 1), ("b", 0))]
    assert plan.freed == (("a", 0), ("a", 1)) and plan.memory_mib == mib(200) + mib(300)
    assert state.gpu_milli_free.tolist() == [[800, 700], [400, 300]]  # the state itself is not changed
    assert apply_defrag(state, plan) is None
    assert state.gpu_milli_free.tolist() == [[1000, 1000], [100, 100]]
    assert fragmentation(state) == pytest.approx(200 / 2200)


def test_the_budget_caps_moves_and_memory_and_cheaper_sources_still_go() -> None:
    state, movable = scene({"s1": (200, "a", 0), "s2": (300, "a", 1), "s3": (600, "b", 0), "s4": (700, "b", 1)},
                           {"a": 2, "b": 2})
    one = plan_defrag(state, movable, max_moves=1)
    assert [m.key for m in one.moves] == ["s1"]
    assert plan_defrag(state, movable, max_moves=0).moves == ()
    # 0.25 of a card's memory: s1 (0.2) fits the budget, s2 (0.3) would go over
    capped = plan_defrag(state, movable, max_moves=8, max_mib=mib(250))
    assert [m.key for m in capped.moves] == ["s1"] and capped.memory_mib == mib(200)
    # with s1 not movable, a/g0 is no source; s2 is the cheapest. Fuller GPUs: b/g0 (0.4 free, 0.1 left after
    # it) and b/g1 (0.3 free, none left): the tighter, b/g1.
    only = plan_defrag(state, {k: v for k, v in movable.items() if k != "s1"}, max_moves=8)
    assert [(m.key, m.target) for m in only.moves] == [("s2", ("b", 1))]
    with pytest.raises(ValueError, match="must not be negative"):
        plan_defrag(state, movable, max_moves=-1)


def test_a_share_never_moves_to_an_idle_gpu_nor_to_an_emptier_one() -> None:
    # a: g0 0.3 (s1); b: g0 idle, g1 0.2 (s2). Emptying a/g0 would need a fuller GPU with 0.3 free: b/g1 is
    # emptier (0.2 used), b/g0 idle: none. Emptying b/g1: s2 to a/g0 (0.3 used > 0.2; 0.7 free): one move.
    state, movable = scene({"s1": (300, "a", 0), "s2": (200, "b", 1)}, {"a": 1, "b": 2})
    plan = plan_defrag(state, movable, max_moves=4)
    assert [(m.key, m.source, m.target) for m in plan.moves] == [("s2", ("b", 1), ("a", 0))]


def test_a_gpu_with_a_holder_that_cannot_move_is_no_source() -> None:
    state, movable = scene({"s1": (200, "a", 0), "h": (100, "a", 0), "s3": (500, "b", 0)}, {"a": 1, "b": 1})
    del movable["h"]
    plan = plan_defrag(state, movable, max_moves=4)
    assert plan.moves == ()  # a/g0 keeps h; b/g0 (0.5) has no fuller GPU to go to
    assert [m.key for m in plan_defrag(state, {**movable, "h": share("h", 100)}, max_moves=4).moves] == ["s1", "h"]


def test_off_node_sends_shares_to_another_node_only() -> None:
    # a: g0 0.2 (s1), g1 0.5 (s2); b: g0 0.4 (s3). Without off_node s1 goes to a/g1 (0.5 free, 0.3 left; b/g0
    # leaves 0.4); with it, b/g0.
    state, movable = scene({"s1": (200, "a", 0), "s2": (500, "a", 1), "s3": (400, "b", 0)}, {"a": 2, "b": 1})
    assert [m.target for m in plan_defrag(state, movable, 1).moves] == [("a", 1)]
    assert [m.target for m in plan_defrag(state, movable, 1, off_node=True).moves] == [("b", 0)]


def test_usable_limits_the_targets() -> None:
    state, movable = scene({"s1": (200, "a", 0), "s2": (500, "a", 1), "s3": (400, "b", 0)}, {"a": 2, "b": 1})
    usable = np.ones_like(state.gpu_healthy)
    usable[state.index["b"], 0] = False
    assert [m.target for m in plan_defrag(state, movable, 1, off_node=True, usable=usable).moves] == []


def test_with_a_measure_a_move_that_leaves_the_workload_worse_off_is_not_made() -> None:
    # Typical task: 0.5 shares. a: g0 0.5 (s1), b: g0 0.3 (s2). Emptying b/g0 into a/g0 (0.5 free, 0.2 left)
    # frees a whole GPU: a's 0.5 hole, usable by a 0.5 task, becomes 0.2 that it cannot use (fragment 200);
    # b's 0.7 free (usable) becomes a whole free GPU (usable): fragmentation 0 -> 200. Without a measure the
    # move is made; with it, not.
    state, movable = scene({"s1": (500, "a", 0), "s2": (300, "b", 0)}, {"a": 1, "b": 1})
    measure = WorkloadArrays.build(state, (TaskShape(1000, 500, 1),))
    assert [m.key for m in plan_defrag(state, movable, 4).moves] == ["s2"]
    assert plan_defrag(state, movable, 4, measure=measure).moves == ()
    # a typical whole-GPU task: b's 0.7 was a fragment (1000 needed), a's 0.5 too; after, a's 0.2 only: made
    whole = WorkloadArrays.build(state, (TaskShape(1000, 1000, 1),))
    assert [m.key for m in plan_defrag(state, movable, 4, measure=whole).moves] == ["s2"]


def test_apply_defrag_refuses_a_stale_round_and_changes_nothing() -> None:
    state, movable = scene({"s1": (200, "a", 0), "s2": (300, "a", 1), "s3": (600, "b", 0), "s4": (700, "b", 1)},
                           {"a": 2, "b": 2})
    plan = plan_defrag(state, movable, max_moves=8)
    before = state.gpu_milli_free.copy()
    put(state, share("late", 300), "b", 0)  # b/g0's hole is gone: s2's move no longer fits
    taken = state.gpu_milli_free.copy()
    refused = apply_defrag(state, plan)
    assert refused is not None and refused.startswith("move of s2:")
    assert (state.gpu_milli_free == taken).all() and not (taken == before).all()
    assert state.held["s1"].allocation.node == "a"
    assert apply_defrag(state, DefragPlan((plan.moves[0],), (), 0)) is None
    assert apply_defrag(ClusterState([node("a", 2), node("b", 2)]), plan) == "share s1 holds nothing"


@st.composite
def clusters(draw: st.DrawFn) -> tuple[ClusterState, dict[str, PodRequest]]:
    n_nodes = draw(st.integers(1, 3))
    state = ClusterState([node(f"n{i}", draw(st.integers(1, 3))) for i in range(n_nodes)])
    movable: dict[str, PodRequest] = {}
    for k in range(draw(st.integers(0, 10))):
        milli = draw(st.sampled_from([50, 100, 200, 250, 300, 500, 600, 800]))
        i = draw(st.integers(0, n_nodes - 1))
        j = draw(st.integers(0, len(state.nodes[i].gpus) - 1))
        pod = share(f"s{k}", milli)
        if state.allocate(pod, Allocation(pod.key, state.nodes[i].name, state.grants_for(i, pod, (j,)))) is None \
                and draw(st.integers(0, 4)):  # one in five placed shares cannot move
            movable[pod.key] = pod
    return state, movable


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.integers(0, 6), st.booleans())
def test_a_round_keeps_every_share_frees_what_it_says_and_stays_in_budget(
        scene_: tuple[ClusterState, dict[str, PodRequest]], max_moves: int, off_node: bool) -> None:
    state, movable = scene_
    before = {k: h.allocation for k, h in state.held.items()}
    used_before = 1000 - state.gpu_milli_free.copy()
    total = state.allocated_milli()
    frag_before = fragmentation(state)
    plan = plan_defrag(state, MovableShares(state, movable), max_moves, off_node=off_node)
    assert len(plan.moves) <= max_moves
    assert len({m.key for m in plan.moves}) == len(plan.moves)  # no share moves twice
    assert all(m.key in movable for m in plan.moves)
    assert plan.memory_mib == sum(m.memory_mib for m in plan.moves)
    for m in plan.moves:
        ti = state.index[m.target[0]]
        assert used_before[ti, m.target[1]] > 0  # never onto an idle GPU
        assert m.target not in plan.freed and m.target != m.source
        if off_node:
            assert m.target[0] != m.source[0]
    assert apply_defrag(state, plan) is None
    assert state.allocated_milli() == total
    for k, alloc in before.items():  # every share keeps its size; only moved ones changed GPU
        now = state.held[k].allocation
        assert [g.milli for g in now.grants] == [g.milli for g in alloc.grants]
        if k not in {m.key for m in plan.moves}:
            assert now == alloc
    for name, j in plan.freed:
        i = state.index[name]
        assert state.gpu_sharers[i, j] == 0 and state.gpu_milli_free[i, j] == 1000
    if plan.freed:
        assert fragmentation(state) < frag_before
