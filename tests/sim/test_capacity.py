"""Capacity search on tiny traces whose answers are known by hand."""

from __future__ import annotations

from collections import Counter

from gpupool.core.model import GPU, GPURequest, Node, PodRequest
from gpupool.sim.capacity import scaled_nodes, search, shape
from gpupool.sim.timeline import TimedPod


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
