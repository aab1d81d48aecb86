"""`dra-default`: kube-scheduler's default plugins over DRA claims, on hand-computed cases."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.fit import check
from gpupool.core.model import GPU, Allocation, GPUGrant, GPURequest, Node, PodRequest
from gpupool.core.placement import Placement, place
from gpupool.core.policies import get_policy
from gpupool.core.policies.dra_default import (
    DraDefault,
    balanced_allocation,
    kube_scores,
    least_allocated,
    num_feasible_nodes_to_find,
    scored_window,
)
from gpupool.core.policy import PolicyContext
from gpupool.core.state import ClusterState

from ..helpers import node, set_free, share, whole


def use(state: ClusterState, node_name: str, cpu: int, mem: int = 0) -> None:
    """Take CPU and memory on a node with a GPU-less pod (test set-up)."""
    pod = PodRequest(f"use-{node_name}-{cpu}-{mem}", cpu, mem)
    assert state.allocate(pod, Allocation(pod.key, node_name, ())) is None


def placed(state: ClusterState, pod: PodRequest, ctx: PolicyContext | None = None) -> Allocation:
    decision = place(state, pod, get_policy("dra-default"), ctx or PolicyContext())
    assert isinstance(decision, Placement), decision
    return decision.allocation


# --- (a) GPU choice inside a node: first fit in index order ------------------------------------------------


def test_a_share_goes_to_the_first_gpu_it_fits_on() -> None:
    state = ClusterState([node("a", gpus=3)])
    set_free(state, "a", [300, 600, 1000])
    # 20 %: GPU 0 has 30 % free, the first that fits. 50 %: GPU 0 is too small, GPU 1 (60 %) is next.
    assert [g.index for g in placed(state, share("p", 200)).grants] == [0]
    assert [g.index for g in placed(state, share("q", 500)).grants] == [1]
    # 70 %: only GPU 2 (100 %) has room.
    assert [g.index for g in placed(state, share("r", 700)).grants] == [2]


def test_first_fit_ignores_a_tighter_gpu_further_on() -> None:
    state = ClusterState([node("a", gpus=2)])
    set_free(state, "a", [600, 300])
    # Best fit would fill GPU 1 (30 % free, left 10 %); the DRA allocator takes GPU 0, the first that fits.
    assert [g.index for g in placed(state, share("p", 200)).grants] == [0]
    assert get_policy("bestfit").choose(state, share("p", 200), 0, np.array([True, True]), PolicyContext()) == (1,)


def test_a_multi_gpu_request_takes_the_first_free_gpus() -> None:
    state = ClusterState([node("a", gpus=4)])
    set_free(state, "a", [1000, 500, 1000, 1000])
    # Two whole GPUs: GPU 1 is partly used, so GPUs 0 and 2.
    assert [g.index for g in placed(state, whole("w", 2)).grants] == [0, 2]


def test_gpu_memory_counts_as_well_as_cores() -> None:
    state = ClusterState([node("a", gpus=2, gpu_mem=16_384)])
    hog = PodRequest("hog", 0, 0, GPURequest(1, 100, memory_mib=12_000))
    assert state.allocate(hog, Allocation("hog", "a", (GPUGrant("a-g0", 0, 100, 12_000),))) is None
    # GPU 0 has 90 % of its cores free but 4,384 MiB of memory: a 6,000 MiB claim goes to GPU 1.
    pod = PodRequest("p", 1000, 1000, GPURequest(1, 300, memory_mib=6000))
    assert [g.index for g in placed(state, pod).grants] == [1]


# --- (b) node choice: LeastAllocated + BalancedAllocation on CPU and memory ----------------------------------


def test_the_node_with_the_most_free_cpu_wins() -> None:
    state = ClusterState([node("a", gpus=2, cpu=32_000, mem=128_000), node("b", gpus=2, cpu=32_000, mem=128_000)])
    use(state, "a", 16_000)
    use(state, "b", 8_000)
    pod = share("p", 500, cpu=4000, mem=4000)
    # a: cpu (32000-20000)*100//32000 = 37, memory (128000-4000)*100//128000 = 96 -> LeastAllocated (37+96)//2 = 66;
    #    fractions 20000/32000 = .625 and 4000/128000 = .03125, std .296875 -> Balanced trunc(70.3125) = 70; 136
    # b: cpu 20000*100//32000 = 62, memory 96 -> (62+96)//2 = 79; fractions .375 and .03125, std .171875 -> 82; 161
    assert least_allocated(state, pod, np.array([0, 1])).tolist() == [66, 79]
    assert balanced_allocation(state, pod, np.array([0, 1])).tolist() == [70, 82]
    scores = DraDefault().score(state, pod, np.array([0, 1]), np.ones((2, 2), dtype=bool), PolicyContext())
    assert np.floor(scores).tolist() == [136, 161]
    assert placed(state, pod).node == "b"


def test_memory_counts_as_much_as_cpu() -> None:
    state = ClusterState([node("a", cpu=32_000, mem=100_000), node("b", cpu=32_000, mem=100_000)])
    use(state, "a", 8_000, 60_000)  # more CPU free than b, much less memory
    use(state, "b", 16_000, 0)
    pod = share("p", 500, cpu=0, mem=0)
    # A pod with no requests scores as 100m and 200 MiB (kube-scheduler's non-zero defaults):
    # a: cpu (32000-8100)*100//32000 = 74, memory (100000-60200)*100//100000 = 39 -> (74+39)//2 = 56
    # b: cpu (32000-16100)*100//32000 = 49, memory (100000-200)*100//100000 = 99 -> (49+99)//2 = 74
    assert least_allocated(state, pod, np.array([0, 1])).tolist() == [56, 74]
    # A best-effort pod skips BalancedAllocation: 0 on every node.
    assert balanced_allocation(state, pod, np.array([0, 1])).tolist() == [0, 0]
    assert placed(state, pod).node == "b"


def test_gpu_use_does_not_enter_the_node_score() -> None:
    state = ClusterState([node("a", gpus=2), node("b", gpus=2)])
    set_free(state, "a", [100, 100])  # a's GPUs are 90 % used, but kube-scheduler does not see claims' devices
    pod = share("p", 100, cpu=1000, mem=1000)
    assert kube_scores(state, pod, np.array([0, 1])).tolist()[0] == kube_scores(state, pod, np.array([0, 1]))[1]


def test_ties_are_drawn_at_random_not_by_node_rank() -> None:
    wins = {"a": 0, "b": 0}
    for seed in range(200):
        state = ClusterState([node("a"), node("b")])
        ctx = PolicyContext(rng=np.random.default_rng(seed), rank=np.array([0, 1], dtype=np.int64))
        wins[placed(state, share("p", 500), ctx).node] += 1
    # Equal scores: uniform between the two (a fixed rank would send all 200 to a).
    assert 70 < wins["a"] < 130 and wins["a"] + wins["b"] == 200


def test_a_higher_score_is_never_overturned_by_the_draw() -> None:
    for seed in range(50):
        state = ClusterState([node("a"), node("b")])
        use(state, "a", 1_000)  # a: cpu (64000-2000)*100//64000 = 96 against b's 98: b wins every time
        ctx = PolicyContext(rng=np.random.default_rng(seed))
        assert placed(state, share("p", 500), ctx).node == "b"


# --- which nodes are scored: percentageOfNodesToScore -------------------------------------------------------


def test_num_feasible_nodes_to_find() -> None:
    assert num_feasible_nodes_to_find(99) == 99  # under 100 nodes: all
    assert num_feasible_nodes_to_find(100) == 100  # 50 % is 50, below the floor of 100
    assert num_feasible_nodes_to_find(1213) == 497  # 50 - 1213//125 = 41 %: 1213*41//100
    assert num_feasible_nodes_to_find(5000) == 500  # 50 - 40 = 10 %
    assert num_feasible_nodes_to_find(10_000) == 500  # 50 - 80 < 5: 5 %
    assert num_feasible_nodes_to_find(1213, 100) == 1213
    assert num_feasible_nodes_to_find(1000, 20) == 200


def test_scored_window_walks_round_robin_from_the_start() -> None:
    every = np.arange(250, dtype=np.int64)  # 250 nodes: 50 - 2 = 48 % -> 120 to find
    window, nxt = scored_window(250, 0, every)
    assert np.flatnonzero(window).tolist() == list(range(120)) and nxt == 120
    window, nxt = scored_window(250, 200, every)  # 200..249, then 0..69; the 121st is node 70
    assert np.flatnonzero(window).tolist() == list(range(70)) + list(range(200, 250)) and nxt == 70
    evens = np.arange(0, 250, 2, dtype=np.int64)  # 125 feasible: the first 120 of them, 0..238; next is 240
    window, nxt = scored_window(250, 0, evens)
    assert evens[window].tolist() == list(range(0, 240, 2)) and nxt == 240
    window, nxt = scored_window(250, 17, evens[:100])  # fewer than 120: all scored, every node checked
    assert window.all() and nxt == 17


def test_the_search_window_moves_on_from_pod_to_pod() -> None:
    # 150 equal nodes (50 - 1 = 49 % is 73: the floor of 100 applies) except node 140, which has twice the
    # CPU and memory and so the best score. The first pod's search covers nodes 0..99 and misses it; the
    # second starts at node 100 and finds it.
    nodes = [node(f"n{i:03d}", gpus=1, cpu=64_000 * (2 if i == 140 else 1), mem=256_000 * (2 if i == 140 else 1))
             for i in range(150)]
    state = ClusterState(nodes)
    ctx = PolicyContext()
    first = placed(state, share("p", 500), ctx)
    assert state.index[first.node] < 100
    assert state.allocate(share("p", 500), first) is None
    assert placed(state, share("q", 500), ctx).node == "n140"
    # Scoring every feasible node (percentageOfNodesToScore 100) finds node 140 at once.
    fresh = ClusterState(nodes)
    decision = place(fresh, share("p", 500), DraDefault(percentage_of_nodes_to_score=100), PolicyContext())
    assert isinstance(decision, Placement) and decision.allocation.node == "n140"


# --- (c) properties: never over-commits, always the lowest-index fitting GPUs ------------------------------

GPU_MEM = 16_384
requests = st.one_of(
    st.builds(lambda m, mem: GPURequest(1, m, memory_mib=mem), st.integers(1, 1000),
              st.one_of(st.none(), st.integers(1, GPU_MEM))),
    st.builds(lambda k: GPURequest(k), st.integers(1, 3)),
)


@settings(max_examples=150, deadline=None)
@given(
    shapes=st.lists(st.tuples(st.integers(1, 4), st.integers(1000, 16_000)), min_size=1, max_size=4),
    stream=st.lists(st.tuples(requests, st.integers(0, 6000), st.integers(0, 20_000)), min_size=1, max_size=40),
    seed=st.integers(0, 2**16),
)
def test_every_choice_fits_and_takes_the_lowest_fitting_gpus(
    shapes: list[tuple[int, int]], stream: list[tuple[GPURequest, int, int]], seed: int
) -> None:
    nodes = [Node(f"n{i}", cpu, 64_000, tuple(GPU(f"n{i}-g{j}", j, "T4", GPU_MEM) for j in range(g)))
             for i, (g, cpu) in enumerate(shapes)]
    state = ClusterState(nodes)
    ctx = PolicyContext(rng=np.random.default_rng(seed))
    for k, (gpu, cpu, mem) in enumerate(stream):
        pod = PodRequest(f"p{k}", cpu, mem, gpu)
        milli_before, mem_before = state.gpu_milli_free.copy(), state.gpu_mem_free.copy()
        feasible = check(state, pod)
        scores = kube_scores(state, pod, feasible.nodes[feasible.code == 0])
        decision = place(state, pod, get_policy("dra-default"), ctx)
        if not isinstance(decision, Placement):
            assert not (feasible.code == 0).any()
            continue
        i = state.index[decision.allocation.node]
        # The GPUs that can take this share, read off the free arrays directly: the chosen ones are the
        # first `count` of them in index order.
        need_mem = gpu.memory_on(GPU_MEM)
        fitting = [j for j in range(len(nodes[i].gpus))
                   if milli_before[i, j] >= min(gpu.milli, 1000) and mem_before[i, j] >= need_mem]
        assert [g.index for g in decision.allocation.grants] == fitting[: gpu.count]
        # The node is one of the best-scored (fewer than 100 nodes: every feasible node is scored).
        ok_nodes = feasible.nodes[feasible.code == 0].tolist()
        assert scores[ok_nodes.index(i)] == scores.max()
        # Taking it never over-commits: the state refuses anything over capacity, and nothing went negative.
        assert state.allocate(pod, decision.allocation) is None
        assert (state.gpu_milli_free >= 0).all() and (state.gpu_mem_free >= 0).all()
        assert (state.cpu_free >= 0).all() and (state.mem_free >= 0).all()
