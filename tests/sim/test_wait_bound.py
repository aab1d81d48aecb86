"""The schedule-independent wait bound on tiny traces worked out by hand, and that no policy beats it."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.model import GPU, GPURequest, Node, PodRequest
from gpupool.sim.timeline import TimedPod, run_timeline
from gpupool.sim.timeline_report import wait_percentile
from gpupool.sim.wait_bound import (
    Pools,
    allowed_late,
    least_late,
    percentile_of_starts,
    pooled_fifo_starts,
    refuted,
    wait_lower_bound,
    witness,
)


def one_gpu_node() -> list[Node]:
    return [Node("n0", 8000, 64_000, (GPU("n0-g0", 0, "T4", 16_384),))]


def timed(key: str, created: int, runs: int, milli: int = 1000, count: int = 1, cpu: int = 1000) -> TimedPod:
    return TimedPod(PodRequest(key, cpu, 1000, GPURequest(count, milli)), created, runs, created + runs)


# a: whole GPU, created 0, runs 100; b: whole GPU, created 10, runs 40; c: whole GPU, created 20, runs 180.
# The trace ends at c's deletion, 200.
THREE = [timed("a", 0, 100), timed("b", 10, 40), timed("c", 20, 180)]


def test_three_pods_on_one_gpu_by_hand() -> None:
    # Waiting at most W, a surely holds the GPU in [W, 100), b in [10+W, 50), c in [20+W, 200). One GPU:
    # no two of these may overlap. a-b overlap iff W < 40, a-c iff W < 80, b-c iff W < 30.
    # p99 of 3 pods: ceil(2.97) = 3 must wait <= W, none may be left out -> refuted iff W < 80: bound 80.
    # The FIFO replay waits a 0, b 90 (starts when a leaves at 100), c 120 (when b leaves at 140): p99 120.
    # (The best order, a b c, also gives 120: the bound is below, not at, the optimum here.)
    assert allowed_late(3, 99) == 0
    assert wait_lower_bound(one_gpu_node(), THREE, 99) == 80
    pools = Pools.build(one_gpu_node(), THREE)
    assert refuted(pools, 79) and not refuted(pools, 80)
    log = run_timeline(one_gpu_node(), THREE, "bestfit", seed=1)
    assert log.waits.tolist() == [0, 90, 120] and wait_percentile(log, 99) == 120
    # p50: ceil(1.5) = 2 pods must wait <= W, one may be left out. At W = 0 all three parts overlap in
    # [20, 50): two must go (the program's row x_a + x_b + x_c >= 2). Leaving out a, b and c clash iff
    # W < 30; leaving out c, a-b iff W < 40; leaving out b, a-c iff W < 80 -> bound 30, and it is met:
    # b runs 10..50 (wait 0), c 50..230 (wait 30), a after them.
    assert allowed_late(3, 50) == 1
    assert least_late(pools, 0) == 2 and least_late(pools, 29) == 2 and least_late(pools, 30) == 1
    assert wait_lower_bound(one_gpu_node(), THREE, 50) == 30


def test_pods_that_fit_no_node_are_late_in_every_schedule() -> None:
    # A 2-GPU pod on a 1-GPU node never runs: with p99 over 3 pods nobody may be left out -> infinite.
    # With p50 one may: it is that pod, and a (0..100) and c (created 20) must not overlap beyond W:
    # c's part [20+W, 200) meets a's [W, 100) iff W < 80 -> 80.
    pods = [timed("a", 0, 100), timed("big", 10, 40, count=2), timed("c", 20, 180)]
    assert math.isinf(wait_lower_bound(one_gpu_node(), pods, 99))
    assert wait_lower_bound(one_gpu_node(), pods, 50) == 80
    assert witness(Pools.build(one_gpu_node(), pods), 80).tolist() == [1]


def test_witness_leaves_out_what_overloads_and_the_rest_waits_zero() -> None:
    # Started at creation: a 0..100, b 10..50, c 20..200. Most overloaded: [20, 50) with 3 GPUs on 1; the
    # most GPU-seconds there is c (180 s): out. Then [10, 50) has a and b: a (100 s) out. b alone fits.
    pools = Pools.build(one_gpu_node(), THREE)
    assert witness(pools).tolist() == [0, 2]


def test_pooled_fifo_matches_the_replay_when_nothing_shares() -> None:
    # Whole GPUs on one node: pooling changes nothing, so the FIFO starts are the replay's: 0, 100, 140.
    pools = Pools.build(one_gpu_node(), THREE)
    start = pooled_fifo_starts(pools, THREE)
    assert start.tolist() == [0, 100, 140]
    assert percentile_of_starts(THREE, start, 99) == 120


def two_nodes() -> list[Node]:
    return [Node(f"n{i}", 16_000, 64_000, tuple(GPU(f"n{i}-g{j}", j, "T4", 16_384) for j in range(2)))
            for i in range(2)]


@st.composite
def workloads(draw: st.DrawFn) -> list[TimedPod]:
    out = []
    for k in range(draw(st.integers(1, 12))):
        count = draw(st.sampled_from([0, 1, 1, 1, 2, 3]))
        milli = draw(st.sampled_from([250, 500, 810, 1000])) if count == 1 else 1000
        out.append(timed(f"p{k}", draw(st.integers(0, 50)), draw(st.integers(0, 80)), milli, count,
                         draw(st.sampled_from([0, 2000, 8000, 20_000]))))
    return out


@settings(max_examples=60, deadline=None)
@given(workloads(), st.sampled_from(["bestfit", "fgd", "gpupool", "random"]), st.sampled_from([50.0, 90.0, 99.0]))
def test_no_policy_waits_less_than_the_bound(pods: list[TimedPod], policy: str, q: float) -> None:
    nodes = two_nodes()
    log = run_timeline(nodes, pods, policy, seed=3)
    bound = wait_lower_bound(nodes, pods, q)
    assert bound <= wait_percentile(log, q)
    # The witness's pods, each started at its creation, fit the pools at every instant.
    pools = Pools.build(nodes, pods)
    out = set(witness(pools).tolist())
    for t in {p.created for p in pods}:
        held = np.zeros(3, dtype=np.int64)
        for k, p in enumerate(pods):
            if k not in out and p.created <= t < p.created + p.runs_for:
                held += pools.demand[k]
        assert (held <= pools.capacity).all()
