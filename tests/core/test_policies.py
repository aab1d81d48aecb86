"""Each policy's node score and GPU choice on hand-computed cases."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.fit import check
from gpupool.core.model import GPURequest, PodRequest
from gpupool.core.placement import Placement, Unschedulable, place
from gpupool.core.policies import UnknownPolicy, get_policy
from gpupool.core.policy import PolicyContext, TaskShape
from gpupool.core.state import ClusterState

from .helpers import node, set_free, share, whole


def scores(state: ClusterState, pod: PodRequest, policy: str, ctx: PolicyContext | None = None) -> list[float]:
    fit = check(state, pod)
    ok = fit.code == 0
    return get_policy(policy).score(state, pod, fit.nodes[ok], fit.gpu_fit[ok], ctx or PolicyContext()).tolist()


def test_bestfit_score() -> None:
    state = ClusterState([node("a", gpus=2, cpu=64_000)])
    # leftover = 0.5*(64000-8000)/128000 + 0.5*(2000-500)/8000 = 0.21875 + 0.09375 = 0.3125
    # score = trunc((1 - 0.3125) * 100) = 68
    assert scores(state, share("p", 500, cpu=8000), "bestfit") == [68]


def test_dotprod_score() -> None:
    state = ClusterState([node("a", gpus=2, cpu=64_000)])
    # dot = (64000/128000)(8000/128000) + (2000/8000)(500/8000) = 0.03125 + 0.015625 = 0.046875
    # score = trunc(100 * (1 - 0.046875/2)) = trunc(97.65625) = 97
    assert scores(state, share("p", 500, cpu=8000), "dotprod") == [97]


def test_packing_bands() -> None:
    state = ClusterState([node("idle", gpus=2), node("used", gpus=2)])
    set_free(state, "used", [300, 1000])
    # idle node: max(33 - 2 free GPUs, 2) = 31; share 200 on the 300-free GPU:
    # 100 - (300*100//1000)//10 = 97; share 500 must open a free GPU of a used node: 50 - 1 = 49
    assert scores(state, share("p", 200), "packing") == [31, 97]
    assert scores(state, share("p", 500), "packing") == [31, 49]
    assert scores(state, whole("w", 1), "packing") == [31, 49]
    assert scores(state, PodRequest("cpu", 1000, 0, GPURequest(0)), "packing") == [0, 0]


def test_clustering_bands() -> None:
    state = ClusterState([node("idle", gpus=8), node("shares", gpus=8), node("wholes", gpus=8)])
    set_free(state, "shares", [500] + [1000] * 7)  # hosts one share pod: left 7500 milli
    state.allocate(whole("w1", 1), place(state, whole("w1", 1), get_policy("firstfit"),
                                          PolicyContext(), np.array([2])).allocation)  # type: ignore[union-attr]
    # share pod: idle 0 + 25 = 25; only-share node: 25*(8000-7500)//8000 + 75 = 1 + 75 = 76;
    # node with only 1-GPU pods (left 7000): 25*1000//8000 + 0 = 3
    assert scores(state, share("p", 300), "clustering") == [25, 76, 3]


def test_fgd_prefers_the_placement_that_fragments_least() -> None:
    # Workload: only 500-milli shares. Node a has a GPU with exactly 500 free, node b is empty.
    # On a: before, the 500 GPU is usable (frag 0+0); after a 500 share it is full: frag stays 0 -> delta 0
    #   -> floor(100*sigmoid(0)) = 50.
    # On b: before 0; after, one GPU has 500 free (still usable for 500): frag 0 -> also 50.
    # A 600 share instead: on b it leaves 400 < 500, fragment 400 -> floor(100*sigmoid(-0.4)) = 40; on a,
    # it cannot use the 500 GPU, takes the free one: 400 left -> 40 as well.
    state = ClusterState([node("a", gpus=2), node("b", gpus=2)])
    set_free(state, "a", [500, 1000])
    ctx = PolicyContext(workload=(TaskShape(0, 500, 1),))
    assert scores(state, share("p", 500, cpu=0), "fgd", ctx) == [50, 50]
    assert scores(state, share("q", 600, cpu=0), "fgd", ctx) == [40, 40]
    decision = place(state, share("p", 500, cpu=0), get_policy("fgd"), ctx)
    assert isinstance(decision, Placement)
    assert decision.allocation.node == "a" and decision.allocation.grants[0].index == 0


def test_share_goes_to_tightest_gpu_for_bestfit() -> None:
    state = ClusterState([node("a", gpus=3)])
    set_free(state, "a", [900, 400, 1000])
    decision = place(state, share("p", 300), get_policy("bestfit"), PolicyContext())
    assert isinstance(decision, Placement) and decision.allocation.grants[0].index == 1


def test_ties_go_to_the_lowest_rank() -> None:
    state = ClusterState([node("a"), node("b"), node("c")])
    ctx = PolicyContext(rank=np.array([2, 0, 1]))
    decision = place(state, share("p", 100), get_policy("firstfit"), ctx)
    assert isinstance(decision, Placement) and decision.allocation.node == "b"


def test_unschedulable_lists_reason_per_node() -> None:
    state = ClusterState([node("a", gpus=1), node("b", gpus=1)])
    decision = place(state, whole("p", 2), get_policy("fgd"), PolicyContext())
    assert isinstance(decision, Unschedulable)
    assert set(decision.reasons) == {"a", "b"} and "2 node(s)" in decision.summary()


def test_unknown_policy_lists_valid_names() -> None:
    with pytest.raises(UnknownPolicy, match="valid policies: random, firstfit"):
        get_policy("magic")


def test_gpupool_takes_nvlinked_gpus_for_multi_gpu_pods() -> None:
    from gpupool.core.model import GPU, Node

    # GPUs 0-1 and 2-3 are NVLink pairs; GPU 0 is partly used, so a 2-GPU pod should get the intact
    # pair (2, 3), not the first two free GPUs (1, 2).
    gpus = tuple(GPU(f"g{j}", j, "H100", 81_920, nvlink_peers=((j ^ 1),)) for j in range(4))
    state = ClusterState([Node("n", 64_000, 256_000, gpus)])
    set_free(state, "n", [900, 1000, 1000, 1000])
    decision = place(state, whole("p", 2), get_policy("gpupool"), PolicyContext())
    assert isinstance(decision, Placement)
    assert [g.index for g in decision.allocation.grants] == [2, 3]
    first = place(state, whole("p", 2), get_policy("firstfit"), PolicyContext())
    assert isinstance(first, Placement) and [g.index for g in first.allocation.grants] == [1, 2]


def test_pairing_table_is_the_least_idle_after_the_best_packing() -> None:
    from gpupool.core.frag import WorkloadArrays
    from gpupool.core.policies.waste import pairing_table

    # The most popular share above half a GPU is 810: its 190 remainder absorbs the 160s, which are left
    # out. Sizes used: 320, 650, 810, 1000.
    wl = (TaskShape(0, 810, 1, weight=0.4), TaskShape(0, 650, 1, weight=0.2), TaskShape(0, 320, 1, weight=0.2),
          TaskShape(0, 160, 1, weight=0.1), TaskShape(0, 1000, 1, weight=0.1))
    table = pairing_table(WorkloadArrays.build(ClusterState([node("a")]), wl))
    # 190: nothing fits (the 160 is left out). 350: one 320, 30 idle. 680: 650 leaves 30 (320 + 320 would
    # leave 40). 970: 650 + 320 fills it. 1000: a whole GPU.
    assert table[[0, 190, 350, 680, 970, 1000]].tolist() == [0, 190, 30, 30, 0, 0]


def test_node_waste_counts_what_the_free_cpu_cannot_feed() -> None:
    from gpupool.core.frag import WorkloadArrays
    from gpupool.core.policies.waste import feed_ratio, node_waste, pairing_table

    # Typical pod: one whole GPU and 10 cores, so a core feeds 0.1 GPU (100 milli per 1000 CPU milli).
    # Node: 4 GPUs, 64 cores (its own ratio 4000/64000 = 0.0625, below the workload's: 0.1 is used).
    state = ClusterState([node("a", gpus=4, cpu=64_000)])
    w = WorkloadArrays.build(state, (TaskShape(10_000, 1000, 1),))
    feed = feed_ratio(state, w)
    assert feed is not None and feed.tolist() == [pytest.approx(0.1)]
    table = pairing_table(w)
    free = np.array([[1000, 1000, 1000, 1000]])
    # 25 free cores feed 2500 of the 4000 idle milli: 1500 stranded. 64 cores feed all of it: no waste.
    assert node_waste(free, np.array([25_000]), table, feed).tolist() == [pytest.approx(1500)]
    assert node_waste(free, np.array([64_000]), table, feed).tolist() == [0]
    # Without CPU in the workload only pairing counts: a GPU with 300 free fits no whole GPU.
    assert node_waste(np.array([[300, 1000]]), np.array([0]), table, None).tolist() == [300]


def test_gpupool_keeps_a_share_off_a_gpu_it_would_strand() -> None:
    # Workload: 470 and 320 shares and whole GPUs, a third each, no CPU. GPUs: [530 (a 470 is there), 1000]
    # free; pod: a 320 share. Pairing table over 320, 470, 1000: W(530) = 60, W(210) = 210, W(680) = 40.
    #   GPU 0 -> [210, 1000]: FGD fragment (every task needs more than 210): 210 -> from 530/3 = 176.7
    #     (only the whole task cannot use the 530), dF = -33.3; waste 60 -> 210, dV = -150.
    #   GPU 1 -> [530, 680]: no GPU can take a whole task: 1210/3 = 403.3, dF = -226.7; waste 60 + 40,
    #     dV = -40, the best dV.
    # FGD: floor(100 sigmoid(-0.0333)) = 49 on GPU 0 against floor(100 sigmoid(-0.2267)) = 44: GPU 0.
    # gpupool: GPU 0 gets -33.3 + 6 (-150 + 40) = -693.3 -> 33; GPU 1 gets -226.7 -> 44: GPU 1, keeping
    # the 530 for another 470 and leaving 680 for a 320 (or a 470) instead of 210 for nothing.
    wl = (TaskShape(0, 470, 1, weight=1 / 3), TaskShape(0, 320, 1, weight=1 / 3), TaskShape(0, 1000, 1, weight=1 / 3))
    state = ClusterState([node("n", gpus=2)])
    set_free(state, "n", [530, 1000])
    pod = share("p", 320, cpu=0)
    fgd = place(state, pod, get_policy("fgd"), PolicyContext(workload=wl))
    ours = place(state, pod, get_policy("gpupool"), PolicyContext(workload=wl))
    assert isinstance(fgd, Placement) and fgd.allocation.grants[0].index == 0 and fgd.score == 49
    assert isinstance(ours, Placement) and ours.allocation.grants[0].index == 1 and ours.score == 44
    # Asked for the GPU without scoring first (bind on one node), it makes the same choice.
    fit = check(state, pod)
    assert get_policy("gpupool").choose(state, pod, 0, fit.gpu_fit[0], PolicyContext(workload=wl)) == (1,)


def test_gpupool_gives_a_cpu_light_pod_to_the_node_whose_cpu_would_strand_gpus() -> None:
    from gpupool.core.model import Allocation

    # Workload: whole GPUs with 10 cores (a core feeds 0.1 GPU). Nodes "rich" and "poor": 4 GPUs and 64
    # cores each, but other pods hold 39 of poor's cores. Pod: one whole GPU with 5 cores.
    # FGD: a typical pod fits before and after on both: delta 0, score 50 on both; the tie goes to "rich".
    # gpupool: rich's 64 cores feed its 4 GPUs before and after (waste 0, dV = 0). Poor: 25 cores feed
    # 2500 of 4000 (waste 1500); after, 20 cores feed 2000 of 3000 (waste 1000): dV = 500, the best.
    # rich: floor(100 sigmoid(6 (0 - 500) / 1000)) = floor(4.74) = 4; poor: 50. The pod takes poor's
    # otherwise stranded GPU and leaves rich's CPU for the typical pods.
    state = ClusterState([node("rich", gpus=4, cpu=64_000), node("poor", gpus=4, cpu=64_000)])
    hog = PodRequest("hog", 39_000, 0, GPURequest(0))
    assert state.allocate(hog, Allocation(hog.key, "poor", ())) is None
    ctx = PolicyContext(workload=(TaskShape(10_000, 1000, 1),))
    pod = whole("p", 1, cpu=5000)
    assert scores(state, pod, "fgd", ctx) == [50, 50]
    assert scores(state, pod, "gpupool", ctx) == [4, 50]
    fgd = place(state, pod, get_policy("fgd"), ctx)
    ours = place(state, pod, get_policy("gpupool"), PolicyContext(workload=ctx.workload))
    assert isinstance(fgd, Placement) and fgd.allocation.node == "rich"
    assert isinstance(ours, Placement) and ours.allocation.node == "poor"


@settings(max_examples=200, deadline=None)
@given(
    free=st.lists(st.lists(st.integers(0, 1000), min_size=4, max_size=4), min_size=1, max_size=5),
    cpu=st.lists(st.integers(0, 64_000), min_size=5, max_size=5),
    tasks=st.lists(
        st.tuples(st.integers(0, 16_000), st.sampled_from([0, 50, 230, 470, 650, 810, 1000]), st.integers(1, 4)),
        min_size=1,
        max_size=4,
    ),
)
def test_waste_lies_between_nothing_and_all_idle_compute(
    free: list[list[int]], cpu: list[int], tasks: list[tuple[int, int, int]]
) -> None:
    from gpupool.core.frag import WorkloadArrays
    from gpupool.core.policies.waste import feed_ratio, node_waste, pairing_table

    state = ClusterState([node(f"n{i}", gpus=4, cpu=64_000) for i in range(len(free))])
    weight = 1 / len(tasks)
    shapes = tuple(TaskShape(c, m, (k if m == 1000 else 1) if m else 0, weight=weight) for c, m, k in tasks)
    w = WorkloadArrays.build(state, shapes)
    table = pairing_table(w)
    assert (table >= 0).all() and (table <= np.arange(1001)).all()
    f = np.array(free, dtype=np.int64)
    waste = node_waste(f, np.array(cpu[: len(free)], dtype=np.int64), table, feed_ratio(state, w))
    assert (waste >= table[f].sum(axis=1) - 1e-9).all() and (waste <= f.sum(axis=1) + 1e-9).all()
