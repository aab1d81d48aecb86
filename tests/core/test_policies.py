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


def test_fill_fragmentation_counts_cpu_stranding_and_share_slack() -> None:
    from gpupool.core.frag import WorkloadArrays
    from gpupool.core.policies.fillfrag import fill_fragmentation

    state = ClusterState([node("a", gpus=3)])
    ok = np.ones((1, 1), dtype=bool)
    # Whole-GPU task with 10 cores, node with 3 free GPUs and 20 free cores. FGD: one copy fits, so no
    # fragment. Fill: min(3 GPUs, 20/10 = 2 by CPU) = 2 copies, 3000 - 2000 = 1000 idle.
    whole_task = WorkloadArrays.build(state, (TaskShape(10_000, 1000, 1),))
    free = np.array([[1000, 1000, 1000]])
    cpu = np.array([20_000])
    assert fill_fragmentation(free, cpu, ok, whole_task, blend=0.0).tolist() == [0.0]
    assert fill_fragmentation(free, cpu, ok, whole_task, blend=1.0).tolist() == [1000.0]
    assert fill_fragmentation(free, cpu, ok, whole_task, blend=0.07).tolist() == pytest.approx([70.0])
    # 470-milli share, no CPU: GPUs with 530 and 1000 free both fit one (FGD: 0). Fill: floor(530/470) +
    # floor(1000/470) = 1 + 2 copies = 1410 of 1530 idle, 120 left.
    share_task = WorkloadArrays.build(state, (TaskShape(0, 470, 1),))
    free = np.array([[530, 1000, 0]])
    assert fill_fragmentation(free, np.array([0]), ok, share_task, blend=1.0).tolist() == [120.0]
    # A 4-GPU task keeps FGD's fragment (3 free GPUs cannot host it: all 3000 idle), whatever the blend.
    multi = WorkloadArrays.build(state, (TaskShape(0, 1000, 4),))
    assert fill_fragmentation(np.array([[1000, 1000, 1000]]), np.array([0]), ok, multi, 1.0).tolist() == [3000.0]


def test_gpupool_gives_a_cpu_light_pod_to_the_node_whose_cpu_would_strand_gpus() -> None:
    # Workload: whole GPUs with 10 cores. Pod: one whole GPU with 5 cores. Nodes: "rich" (4 GPUs, 64
    # cores) first in node order, "poor" (4 GPUs, 25 cores).
    # FGD: one typical pod fits before and after on both nodes -> delta 0 -> score 50 on both; the tie
    # goes to the first node, "rich".
    # gpupool (blend 0.07 of the fill fragment): rich: min(4, 6) copies before, min(3, 5) after -> no
    # fragment, delta 0 -> 50. poor: before min(4 GPUs, 25/10 = 2) = 2 copies -> 2000 idle, blended
    # 0.07*2000 = 140; after (3 GPUs, 20 cores) min(3, 2) = 2 -> 1000 -> 70. delta = 70 ->
    # floor(100*sigmoid(0.07)) = floor(51.75) = 51: "poor" wins, and leaves the CPU-rich node's GPUs
    # usable by the typical 10-core pods.
    state = ClusterState([node("rich", gpus=4, cpu=64_000), node("poor", gpus=4, cpu=25_000)])
    ctx = PolicyContext(workload=(TaskShape(10_000, 1000, 1),))
    pod = whole("p", 1, cpu=5000)
    assert scores(state, pod, "fgd", ctx) == [50, 50]
    assert scores(state, pod, "gpupool", ctx) == [50, 51]
    fgd = place(state, pod, get_policy("fgd"), ctx)
    ours = place(state, pod, get_policy("gpupool"), PolicyContext(workload=ctx.workload))
    assert isinstance(fgd, Placement) and fgd.allocation.node == "rich"
    assert isinstance(ours, Placement) and ours.allocation.node == "poor"


def test_gpupool_share_fills_the_gpu_it_fits_exactly() -> None:
    # Workload: 470 and 320 shares, half each, no CPU. GPUs: [1000, 470] free; pod: a 470 share.
    # FGD: either GPU leaves every GPU able to take either task -> delta 0 -> 50 for both; first GPU (0).
    # Fill (idle left after packing copies of each task):
    #   before [1000, 470]: 470-task 2+1 copies -> 1470-1410 = 60; 320-task 3+1 -> 1470-1280 = 190;
    #     mean 125, blended 0.07*125 = 8.75
    #   GPU 0 -> [530, 470]: 1+1 -> 1000-940 = 60; 1+1 -> 1000-640 = 360; mean 210 -> 14.7;
    #     delta -5.95 -> floor(100*sigmoid(-0.00595)) = floor(49.85) = 49
    #   GPU 1 -> [1000, 0]: 2 -> 60; 3 -> 40; mean 50 -> 3.5; delta +5.25 -> floor(50.13) = 50
    # so gpupool takes GPU 1 and keeps a whole GPU free.
    wl = (TaskShape(0, 470, 1, weight=0.5), TaskShape(0, 320, 1, weight=0.5))
    state = ClusterState([node("n", gpus=2)])
    set_free(state, "n", [1000, 470])
    pod = share("p", 470, cpu=0)
    fgd = place(state, pod, get_policy("fgd"), PolicyContext(workload=wl))
    ours = place(state, pod, get_policy("gpupool"), PolicyContext(workload=wl))
    assert isinstance(fgd, Placement) and fgd.allocation.grants[0].index == 0 and fgd.score == 50
    assert isinstance(ours, Placement) and ours.allocation.grants[0].index == 1 and ours.score == 50


@settings(max_examples=200, deadline=None)
@given(
    free=st.lists(st.lists(st.integers(0, 1000), min_size=4, max_size=4), min_size=1, max_size=5),
    cpu=st.lists(st.integers(0, 64_000), min_size=5, max_size=5),
    tasks=st.lists(
        st.tuples(st.integers(0, 16_000), st.sampled_from([0, 50, 230, 470, 810, 1000]), st.integers(1, 4)),
        min_size=1,
        max_size=4,
    ),
)
def test_fill_fragment_is_fgds_at_blend_zero_and_never_below_it(
    free: list[list[int]], cpu: list[int], tasks: list[tuple[int, int, int]]
) -> None:
    from gpupool.core.frag import WorkloadArrays, node_fragmentation
    from gpupool.core.policies.fillfrag import fill_fragmentation

    state = ClusterState([node("a", gpus=4)])
    # CPU-only tasks take no GPU; only whole-GPU tasks take several GPUs.
    weight = 1 / len(tasks)
    shapes = tuple(TaskShape(c, m, (k if m == 1000 else 1) if m else 0, weight=weight) for c, m, k in tasks)
    w = WorkloadArrays.build(state, shapes)
    f = np.array(free, dtype=np.int64)
    c = np.array(cpu[: len(free)], dtype=np.int64)
    ok = np.ones((len(free), len(shapes)), dtype=bool)
    fgd = node_fragmentation(f, c, ok, w)
    assert fill_fragmentation(f, c, ok, w, blend=0.0) == pytest.approx(fgd)
    assert np.all(fill_fragmentation(f, c, ok, w, blend=1.0) >= fgd - 1e-9)
    assert np.all(fill_fragmentation(f, c, ok, w, blend=1.0) <= f.sum(axis=1) + 1e-9)
