"""Capacity search on tiny traces whose answers are known by hand."""

from __future__ import annotations

import math
from collections import Counter

from gpupool.core.model import GPU, GPURequest, Node, PodRequest
from gpupool.sim.capacity import (
    fewer_nodes_targets,
    fewest_nodes_possible,
    nodes_needed,
    p99_leaving_out,
    scaled_nodes,
    search,
    shape,
    sweep_job,
)
from gpupool.sim.timeline import TimedPod, run_timeline
from gpupool.sim.timeline_report import wait_percentile


def gpu_node(name: str, model: str = "T4", gpus: int = 1) -> Node:
    return Node(name, 8000, 64_000, tuple(GPU(f"{name}-g{j}", j, model, 16_384) for j in range(gpus)))


def burst(n: int, count: int = 1) -> list[TimedPod]:
    """n pods of `count` whole GPUs, all created at 0, each running 100 s (the trace ends at 1000)."""
    return [TimedPod(PodRequest(f"p{k}", 1000, 1000, GPURequest(count)), 0, 100, 1000) for k in range(n)]


def test_scaling_keeps_the_mix_and_copies_beyond_the_list() -> None:
    nodes = [gpu_node(f"t{i}") for i in range(3)] + [gpu_node("g0", "G2", 8)]
    eight = scaled_nodes(nodes, 8)  # 3:1 mix -> 6 T4 and 2 G2 nodes
    assert Counter(shape(n)[3] for n in eight) == {"T4": 6, "G2": 2}
    assert len({n.name for n in eight}) == 8 and "g0-copy1" in {n.name for n in eight}
    # 2 nodes: quotas 1.5 and 0.5, largest remainders tie -> the shape seen first gets the extra node.
    assert [n.name for n in scaled_nodes(nodes, 2)] == ["t0", "t1"]


def test_smallest_cluster_meeting_the_wait_target() -> None:
    # Four 1-GPU pods at once, 100 s each. With n one-GPU nodes: n start at 0, the others wait 100 s per
    # round: n=1 waits 0/100/200/300 (p99 300), n=2 0/0/100/100 (p99 100), n=3 p99 100, n=4 p99 0.
    nodes = [gpu_node(f"n{i}") for i in range(4)]
    a = search(nodes, burst(4), "bestfit", 1, target_s=100)
    assert (a.nodes, a.gpus) == (2, 2) and a.tried[1] == 300 and a.tried[2] == 100
    a = search(nodes, burst(4), "gpupool", 1, target_s=0)
    assert (a.nodes, a.gpus) == (4, 4) and a.tried[4] == 0


def test_no_size_meets_the_target_when_a_pod_fits_no_node() -> None:
    # A 2-GPU pod on 1-GPU nodes never runs: its wait is infinite at every size up to 4x the list.
    nodes = [gpu_node(f"n{i}") for i in range(2)]
    a = search(nodes, burst(1, count=2) + burst(1), "fgd", 1, target_s=3600)
    assert a.nodes is None and max(a.tried) == 8
    assert a.best[1] == float("inf")


def test_searches_for_several_targets_replay_each_size_once() -> None:
    # burst(4) on n one-GPU nodes: p99 300 at n=1, 100 at n=2 and 3, 0 at n=4 (see above).
    # Target 300: 1 meets it. Target 100: 1 fails, 2 meets. Target 0: 1, 2 fail, 4 meets, 3 (between)
    # fails -> 4. Sizes 1, 2, 3, 4 are each measured once over the three searches.
    nodes = [gpu_node(f"n{i}") for i in range(4)]
    measured: list[int] = []

    def p99(scaled: list[Node]) -> float:
        measured.append(len(scaled))
        return {1: 300.0, 2: 100.0, 3: 100.0, 4: 0.0}[len(scaled)]

    cache: dict[int, float] = {}
    answers = [search(nodes, burst(4), "bestfit", 1, t, p99=p99, cache=cache) for t in (300, 100, 0)]
    assert [a.nodes for a in answers] == [1, 2, 4]
    assert sorted(measured) == [1, 2, 3, 4] and cache == {1: 300, 2: 100, 3: 100, 4: 0}
    assert all(a.tried is cache for a in answers)


def test_a_size_meets_the_target_only_if_it_does_on_every_seed() -> None:
    # Two 1-GPU nodes that first-fit cannot tell apart (every node scores alike; the seed's node order
    # decides): A with 64,000 MiB, B with 8,000. p0 (1,000 MiB, 500 s) arrives at 0, p1 (60,000 MiB, fits A
    # only) at 1. A seed that puts p0 on B: nobody waits. One that puts p0 on A: p1 waits until 500, 499 s
    # (p99 of two pods is the longer wait). One node (A alone) always waits 499; three nodes (A, a copy of A,
    # B: the tied remainder goes to the shape seen first) always have an A free for p1.
    nodes = [Node("a", 8000, 64_000, (GPU("a-g0", 0, "T4", 16_384),)),
             Node("b", 8000, 8_000, (GPU("b-g0", 0, "T4", 16_384),))]
    pods = [TimedPod(PodRequest("p0", 1000, 1000, GPURequest(1)), 0, 500, 1000),
            TimedPod(PodRequest("p1", 1000, 60_000, GPURequest(1)), 1, 100, 1000)]
    by_wait: dict[float, int] = {}
    for s in range(20):
        by_wait.setdefault(wait_percentile(run_timeline(nodes, pods, "firstfit", s), 99), s)
    assert set(by_wait) == {0, 499}
    lucky, unlucky = by_wait[0], by_wait[499]
    assert search(nodes, pods, "firstfit", lucky, target_s=0).nodes == 2
    assert search(nodes, pods, "firstfit", unlucky, target_s=0).nodes == 3
    both = search(nodes, pods, "firstfit", lucky, target_s=0, seeds=(lucky, unlucky))
    assert both.nodes == 3 and both.tried[2] == 499
    assert both.by_seed[2] == {lucky: 0, unlucky: 499} and both.by_seed[3] == {lucky: 0, unlucky: 0}


def test_sweep_job_replays_the_timeline_per_target() -> None:
    # The same burst replayed for real: the answers of test_smallest_cluster_meeting_the_wait_target.
    nodes = [gpu_node(f"n{i}") for i in range(4)]
    answers = sweep_job(nodes, burst(4), "fgd", 1, targets=[300, 100, 0])
    assert [a.nodes for a in answers] == [1, 2, 4]
    assert answers[0].tried == {1: 300, 2: 100, 3: 100, 4: 0}


def test_targets_where_one_policy_needs_fewer_nodes() -> None:
    # a meets 500 s at 2 nodes and 0 at 3; b needs 800 s at 2 nodes and 0 at 3; neither finishes at 1.
    # For targets [500, 800) a needs 2 nodes, b 3; from 800 on both need 2; below 500 both need 3.
    a = {1: math.inf, 2: 500.0, 3: 0.0}
    b = {1: math.inf, 2: 800.0, 3: 0.0}
    assert nodes_needed(a, 499) == 3 and nodes_needed(a, 500) == 2 and nodes_needed({1: math.inf}, 10) is None
    assert fewer_nodes_targets(a, b) == [(500.0, 800.0)]
    assert fewer_nodes_targets(b, a) == []
    # A policy that meets some target where the other meets none at any measured size: up to infinity.
    assert fewer_nodes_targets({2: 50.0}, {2: math.inf}) == [(50.0, math.inf)]


def test_refusing_pods_counts_them_as_never_ran() -> None:
    # Two 1-GPU pods at once on one node: 0 and 100 s. Refusing the second: waits 0 and never -> p99 of
    # two (ceil(1.98) = 2nd smallest) is never; refusing none: 100.
    nodes = [gpu_node("n0")]
    assert p99_leaving_out(nodes, burst(2), "gpupool", 1) == 100
    assert p99_leaving_out(nodes, burst(2), "gpupool", 1, leave_out=[1]) == math.inf


def test_sizes_up_to_the_floor_are_not_replayed() -> None:
    # Told that one node fails, the search for p99 0 doubles from 2: 2 fails (100), 4 meets, 3 fails -> 4.
    nodes = [gpu_node(f"n{i}") for i in range(4)]
    a = search(nodes, burst(4), "bestfit", 1, target_s=0, floor=1)
    assert a.nodes == 4 and a.tried == {2: 100, 3: 100, 4: 0}


def test_fewest_nodes_the_bound_allows() -> None:
    # Four 1-GPU pods at 0 for 100 s, p99 over 4 pods: none may be late. Waiting at most W each holds its
    # GPU during [W, 100): for W < 100 all four overlap, so n nodes carry them only if n >= 4; at W >= 100
    # (the trace ends at 1000) nothing is compulsory and one node is not ruled out.
    nodes = [gpu_node(f"n{i}") for i in range(4)]
    assert fewest_nodes_possible(nodes, burst(4), 99) == 4
    assert fewest_nodes_possible(nodes, burst(4), 100) == 1
    # A 2-GPU pod fits no 1-GPU node at any size: ruled out up to 4 x 2 nodes.
    assert fewest_nodes_possible(nodes[:2], burst(1, count=2), 3600) is None
