"""gpupool.core.moves: hand-computed plans, no plan within N, and properties against a brute force."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.core.fit import OK, check
from gpupool.core.model import Allocation, GPURequest, PodRequest
from gpupool.core.moves import MovableShares, MovePlan, apply_plan, plan_moves
from gpupool.core.state import ClusterState
from tests.core.helpers import node, share, whole

GPU_MEM = 40_960  # helpers.node's card


def put(state: ClusterState, pod: PodRequest, node_name: str, gpu: int) -> None:
    i = state.index[node_name]
    assert state.allocate(pod, Allocation(pod.key, node_name, state.grants_for(i, pod, (gpu,)))) is None


def mib(milli: int) -> int:
    return GPU_MEM * milli // 1000


def test_one_plan_moves_the_small_share_into_the_hole() -> None:
    # a: g0 600+300 (100 free), g1 700 (300 free); b: g0 300 (700 free). A 0.8 share fits nowhere. With one
    # move: s4 (0.3) into a/g1's hole frees b/g0 (0.3 of a card moved), or s3 (0.7) to b/g0 frees a/g1 (0.7
    # moved); a/g0 needs two moves. The plan is the first, and only it costs 0.3 of a card.
    st = ClusterState([node("a", 2), node("b", 1)])
    pods = {"s1": (share("s1", 600), "a", 0), "s2": (share("s2", 300), "a", 0), "s3": (share("s3", 700), "a", 1),
            "s4": (share("s4", 300), "b", 0)}
    for pod, n, j in pods.values():
        put(st, pod, n, j)
    movable = {k: p for k, (p, _, _) in pods.items()}
    request = share("r", 800)
    assert check(st, request).code.tolist() != [OK, OK]
    plan = plan_moves(st, request, movable, 1)
    assert plan is not None
    assert [(m.key, m.source, m.target) for m in plan.moves] == [("s4", ("b", 0), ("a", 1))]
    assert plan.memory_mib == mib(300) and plan.cost == mib(300) / 1024
    assert plan.allocation.node == "b" and [g.index for g in plan.allocation.grants] == [0]
    assert apply_plan(st, plan, request) is None
    assert st.gpu_milli_free.tolist() == [[100, 0], [200, 0]]
    # With s4 not movable the only plan left moves s3 (0.7) to b/g0 and puts the request on a/g1.
    st2 = ClusterState([node("a", 2), node("b", 1)])
    for pod, n, j in pods.values():
        put(st2, pod, n, j)
    plan2 = plan_moves(st2, request, {k: p for k, p in movable.items() if k != "s4"}, 1)
    assert plan2 is not None and [(m.key, m.target) for m in plan2.moves] == [("s3", ("b", 0))]
    assert plan2.memory_mib == mib(700) and plan2.allocation.node == "a"


def test_no_plan_within_n_moves() -> None:
    # The only GPU that could take a 0.9 share holds two 0.3 shares; both must go (to the other node's two
    # 0.5 holes): 2 moves. With N = 1 there is no plan; with N = 2 there is exactly one, of both shares.
    st = ClusterState([node("a", 1), node("b", 2)])
    put(st, share("x", 300), "a", 0)
    put(st, share("y", 300), "a", 0)
    put(st, share("f1", 500), "b", 0)
    put(st, share("f2", 500), "b", 1)
    movable = {"x": share("x", 300), "y": share("y", 300)}
    request = share("r", 900)
    assert plan_moves(st, request, movable, 1) is None
    assert plan_moves(st, request, movable, 0) is None
    plan = plan_moves(st, request, movable, 2)
    assert plan is not None and sorted(m.key for m in plan.moves) == ["x", "y"]
    assert {m.target for m in plan.moves} == {("b", 0), ("b", 1)} and plan.memory_mib == 2 * mib(300)


def test_off_node_sends_a_moved_share_to_another_node() -> None:
    # a: g0 holds s1 (0.5, movable), g1 f1 (0.5); b: g0 f2 (0.4). A 0.8 share fits nowhere; moving s1 frees a/g0.
    # s1's tightest target is a/g1 (0.5 free, none left after), then b/g0 (0.6 free, 0.1 left). With off_node
    # (a remote share: one server per node), not a/g1: a is the node it leaves. With f2 at 0.6, b/g0 has 0.4 free
    # and s1 fits nowhere off its node: no plan.
    def scene(f2: int) -> ClusterState:
        st = ClusterState([node("a", 2), node("b", 1)])
        put(st, share("s1", 500), "a", 0)
        put(st, share("f1", 500), "a", 1)
        put(st, share("f2", f2), "b", 0)
        return st

    movable, request = {"s1": share("s1", 500)}, share("r", 800)
    same = plan_moves(scene(400), request, movable, 1)
    assert same is not None and [(m.key, m.source, m.target) for m in same.moves] == [("s1", ("a", 0), ("a", 1))]
    off = plan_moves(scene(400), request, movable, 1, off_node=True)
    assert off is not None and [(m.key, m.source, m.target) for m in off.moves] == [("s1", ("a", 0), ("b", 0))]
    assert off.allocation.node == "a" and [g.index for g in off.allocation.grants] == [0]
    assert plan_moves(scene(600), request, movable, 1, off_node=True) is None


def test_whole_gpus_freed_for_a_two_gpu_pod_and_a_budget() -> None:
    # Node a has 3 GPUs, each with one share (0.1, 0.2, 0.4); node b has room for them. A 2-GPU pod takes
    # the two cheapest GPUs once their shares move; a cost budget below that refuses it.
    st = ClusterState([node("a", 3), node("b", 1)])
    for k, (milli, j) in {"p": (100, 0), "q": (200, 1), "s": (400, 2)}.items():
        put(st, share(k, milli), "a", j)
    movable = {"p": share("p", 100), "q": share("q", 200), "s": share("s", 400)}
    request = whole("w", 2)
    plan = plan_moves(st, request, movable, 2)
    assert plan is not None and sorted(m.key for m in plan.moves) == ["p", "q"]
    assert sorted(g.index for g in plan.allocation.grants) == [0, 1]
    assert plan_moves(st, request, movable, 1) is None
    assert plan_moves(st, request, movable, 2, cost_per_gib=1.0, max_cost=plan.cost - 0.01) is None
    assert apply_plan(st, plan, request) is None and st.held["w"].allocation.node == "a"


def test_fewest_moves_first_when_memory_is_free() -> None:
    # GPU a/g0: one 0.5 share; a/g1: two 0.2 shares (less memory in all); b/g0 0.8 free. A 0.9 share needs one of them
    # emptied enough: by memory the two 0.2 (0.4 of a card) win, by moves (cost 0) the single 0.5.
    st = ClusterState([node("a", 2), node("b", 1)])
    put(st, share("big", 500), "a", 0)
    put(st, share("t1", 200), "a", 1)
    put(st, share("t2", 200), "a", 1)
    put(st, share("fill", 200), "b", 0)
    movable = {k: share(k, m) for k, m in (("big", 500), ("t1", 200), ("t2", 200))}
    request = PodRequest("r", 1000, 1000, GPURequest(1, 900))
    by_memory = plan_moves(st, request, movable, 2)
    by_moves = plan_moves(st, request, movable, 2, cost_per_gib=0.0)
    assert by_memory is not None and sorted(m.key for m in by_memory.moves) == ["t1", "t2"]
    assert by_moves is not None and [m.key for m in by_moves.moves] == ["big"] and by_moves.cost == 0.0


# --- properties on tiny states -------------------------------------------------------------------------

NODES, GPUS = 2, 2


def _key(memory: int, moves: int) -> tuple[int, int]:
    return (memory, moves)


def brute_force(state: ClusterState, request: PodRequest, movable: dict[str, PodRequest],
                n: int) -> tuple[int, int] | None:
    """The least (memory moved, moves) over every plan of the documented space: the request on a GPU set G of
    one node that has its CPU and memory; movable shares on G, in every order, each to any GPU outside G."""
    best: tuple[int, int] | None = None
    for i, nd in enumerate(state.nodes):
        if state.cpu_free[i] < request.cpu_milli or state.mem_free[i] < request.memory_mib:
            continue
        for gpus in itertools.combinations(range(len(nd.gpus)), request.gpu.count):
            on = [k for k in movable if k in state.held and state.held[k].node_index == i
                  and state.held[k].allocation.grants[0].index in gpus]
            others = [(i2, j2) for i2, n2 in enumerate(state.nodes) for j2 in range(len(n2.gpus))
                      if not (i2 == i and j2 in gpus)]
            for r in range(min(n, len(on)) + 1):
                for subset in itertools.permutations(on, r):
                    for targets in itertools.product(others, repeat=r):
                        work = state.copy()
                        memory = 0
                        ok = True
                        for key, (ti, tj) in zip(subset, targets, strict=True):
                            held = work.held[key]
                            pod = PodRequest(key, held.cpu_milli, held.memory_mib, movable[key].gpu)
                            memory += held.allocation.grants[0].memory_mib
                            work.release(key)
                            uuid = work.nodes[ti].gpus[tj].uuid
                            only = replace(pod, gpu=replace(pod.gpu, include_uuids=frozenset({uuid})))
                            if check(work, only, np.asarray([ti])).code[0] != OK:
                                ok = False
                                break
                            work.allocate(pod, Allocation(key, work.nodes[ti].name, work.grants_for(ti, pod, (tj,))))
                        if not ok:
                            continue
                        uuids = frozenset(nd.gpus[j].uuid for j in gpus)
                        there = replace(request, gpu=replace(request.gpu, include_uuids=uuids))
                        if check(work, there, np.asarray([i])).code[0] == OK:
                            key2 = _key(memory, r)
                            best = key2 if best is None or key2 < best else best
    return best


SHARE = st.sampled_from([100, 200, 300, 400, 500, 600, 700, 800])


@st.composite
def tiny(draw: st.DrawFn) -> tuple[ClusterState, dict[str, PodRequest], PodRequest, int]:
    state = ClusterState([node(f"n{i}", GPUS) for i in range(NODES)])
    movable: dict[str, PodRequest] = {}
    for k in range(draw(st.integers(1, 6))):
        pod = share(f"s{k}", draw(SHARE))
        i, j = draw(st.integers(0, NODES - 1)), draw(st.integers(0, GPUS - 1))
        if state.gpu_milli_free[i, j] >= pod.gpu.milli:
            state.allocate(pod, Allocation(pod.key, state.nodes[i].name, state.grants_for(i, pod, (j,))))
            if draw(st.booleans()) or k == 0:
                movable[pod.key] = pod
    request = draw(st.one_of(st.builds(lambda m: share("req", m), st.sampled_from([300, 500, 700, 900, 1000])),
                             st.just(whole("req", 1)), st.just(whole("req", 2))))
    return state, movable, request, draw(st.integers(0, 3))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny())
def test_plan_is_valid_and_cheapest(case: tuple[ClusterState, dict[str, PodRequest], PodRequest, int]) -> None:
    state, movable, request, n = case
    before = {k: h.allocation.grants for k, h in state.held.items()}
    plan = plan_moves(state, request, movable, n)
    assert {k: h.allocation.grants for k, h in state.held.items()} == before  # the state is not changed
    expected = brute_force(state, request, movable, n)
    if plan is None:
        assert expected is None
        return
    assert expected is not None and _key(plan.memory_mib, len(plan.moves)) == expected
    check_applied(state, plan, request, movable, n)


def check_applied(state: ClusterState, plan: MovePlan, request: PodRequest, movable: dict[str, PodRequest],
                  n: int) -> None:
    sizes = {k: (h.allocation.grants[0].milli, h.allocation.grants[0].memory_mib) for k, h in state.held.items()}
    assert len(plan.moves) <= n and len({m.key for m in plan.moves}) == len(plan.moves)
    assert all(m.key in movable for m in plan.moves)
    assert apply_plan(state, plan, request) is None
    assert state.held["req"].allocation == plan.allocation
    assert (state.gpu_milli_free >= 0).all() and (state.gpu_mem_free >= 0).all()
    assert (state.cpu_free >= 0).all() and (state.mem_free >= 0).all()
    for m in plan.moves:
        held = state.held[m.key]
        assert (state.nodes[held.node_index].name, held.allocation.grants[0].index) == m.target
        assert held.allocation.grants[0].milli == sizes[m.key][0]  # a moved share keeps its size
        assert m.memory_mib == sizes[m.key][1]


def test_a_kept_index_gives_the_same_plan_and_follows_moves() -> None:
    st_ = ClusterState([node("a", 2), node("b", 2)])
    put(st_, share("x", 400), "a", 0)
    put(st_, share("y", 700), "a", 1)
    put(st_, share("z", 500), "b", 0)
    put(st_, share("w", 600), "b", 1)
    movable = {"x": share("x", 400), "y": share("y", 700), "z": share("z", 500)}
    index = MovableShares(st_, movable)
    request = share("r", 900)
    plan = plan_moves(st_, request, movable, 2)
    assert plan == plan_moves(st_, request, index, 2)
    assert plan is not None and apply_plan(st_, plan, request) is None
    index.moved(plan)
    assert index.by_gpu == MovableShares(st_, movable).by_gpu
    assert int(index.count.sum()) == 3
