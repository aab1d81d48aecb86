"""Timeline replay on tiny traces whose outcome is worked out by hand, and its invariants."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.model import GPU, GPURequest, Node, PodRequest
from gpupool.sim.timeline import TimedPod, run_timeline, timed_pods
from gpupool.sim.timeline_report import summarise_timeline, time_weighted, wait_percentile


def one_gpu_node(cpu: int = 8000) -> list[Node]:
    return [Node("n0", cpu, 64_000, (GPU("n0-g0", 0, "T4", 16_384),))]


def pod(key: str, milli: int = 1000, count: int = 1, cpu: int = 1000) -> PodRequest:
    return PodRequest(key, cpu, 1000, GPURequest(count, milli))


def test_three_pods_on_one_gpu_wait_in_fifo_order() -> None:
    # a: created 0, scheduled 0, deleted 100 -> runs 100 s; b: created 10, never scheduled, deleted 50
    # -> runs 50 - 10 = 40 s; c: a half share created 20, never scheduled, deleted 200 -> runs 180 s.
    pods = timed_pods([pod("a"), pod("b"), pod("c", 500)], [(0, 0, 100), (10, None, 50), (20, None, 200)])
    assert [p.runs_for for p in pods] == [100, 40, 180]
    log = run_timeline(one_gpu_node(), pods, "bestfit", seed=1)
    # t=0 a starts. t=10 b waits (GPU taken). t=20 c waits. t=100 a leaves; FIFO tries b first: it takes
    # the whole GPU (leaves at 140), c still does not fit. t=140 b leaves, c starts (would leave at 320,
    # after the trace's end at 200, the last deletion).
    assert log.start.tolist() == [0, 100, 140]
    assert log.waits.tolist() == [0, 90, 120]
    assert log.t.tolist() == [0, 10, 20, 100, 140]
    assert log.allocated.tolist() == [1000, 1000, 1000, 1000, 500]
    assert log.pending.tolist() == [0, 1, 2, 1, 0]
    assert wait_percentile(log, 50) == 90 and wait_percentile(log, 99) == 120
    # Over 0..200: one GPU for 140 s, half a GPU for 60 s -> mean (140 + 30) / 200 = 0.85 GPUs; the
    # lowest 10 % of the time (20 s) lies in the half-GPU stretch -> p10 0.5.
    assert time_weighted(log, log.allocated / 1000) == (0.85, 0.5)
    s = summarise_timeline(log)
    assert s["never_ran"] == 0 and s["gpu_alloc_mean_pct"] == 85.0 and s["pending_peak"] == 2


def test_a_pod_that_does_not_fit_does_not_block_the_ones_behind_it() -> None:
    # a: 0.6 GPU for 100 s from 0; b: whole GPU at 10 (deleted 300, never scheduled: 290 s);
    # c: 0.3 GPU at 20 for 200 s. c fits beside a at once; b waits until both left: 220.
    pods = timed_pods([pod("a", 600), pod("b"), pod("c", 300)], [(0, 0, 100), (10, None, 300), (20, 20, 220)])
    log = run_timeline(one_gpu_node(), pods, "fgd", seed=1)
    assert log.start.tolist() == [0, 220, 20]
    assert log.waits.tolist() == [0, 210, 0]


def test_pods_still_waiting_at_the_end_never_ran_and_wait_forever() -> None:
    # b asks two GPUs of a one-GPU node: never. c waits for a, which holds the GPU until 150, but the
    # replay is told the trace ends at 120 (by default: the last deletion, 150, when c would start).
    pods = timed_pods([pod("a"), pod("b", count=2), pod("c")], [(0, 0, 150), (5, None, 50), (10, None, 60)])
    assert run_timeline(one_gpu_node(), pods, "gpupool", seed=1).start.tolist() == [0, -1, 150]
    log = run_timeline(one_gpu_node(), pods, "gpupool", seed=1, end=120)
    assert log.start.tolist() == [0, -1, -1]
    assert np.isinf(wait_percentile(log, 99)) and wait_percentile(log, 33) == 0
    assert summarise_timeline(log)["never_ran"] == 2


def two_nodes() -> list[Node]:
    return [Node(f"n{i}", 16_000, 64_000, tuple(GPU(f"n{i}-g{j}", j, "T4", 16_384) for j in range(2)))
            for i in range(2)]


@st.composite
def workloads(draw: st.DrawFn) -> list[TimedPod]:
    n = draw(st.integers(1, 14))
    out = []
    for k in range(n):
        count = draw(st.sampled_from([0, 1, 1, 1, 2]))
        milli = draw(st.sampled_from([250, 500, 810, 1000])) if count == 1 else 1000
        created = draw(st.integers(0, 50))
        runs = draw(st.integers(1, 60))
        req = PodRequest(f"p{k}", draw(st.sampled_from([0, 2000, 8000])), 1000, GPURequest(count, milli))
        out.append(TimedPod(req, created, runs, created + runs))
    return out


@settings(max_examples=60, deadline=None)
@given(workloads(), st.sampled_from(["bestfit", "fgd", "gpupool", "random"]))
def test_at_every_instant_shares_fit_their_nodes(pods: list[TimedPod], policy: str) -> None:
    nodes = two_nodes()
    log = run_timeline(nodes, pods, policy, seed=3, end=10_000)
    ran = np.flatnonzero(log.start >= 0)
    assert len(ran) == len(pods)  # the end is far away and every pod fits an empty node
    for t in sorted(set(log.t.tolist())):
        gpu = np.zeros((2, 2), dtype=np.int64)
        cpu = np.zeros(2, dtype=np.int64)
        for k in ran:
            if log.start[k] <= t < log.start[k] + pods[k].runs_for:
                g = pods[k].request.gpu
                i = int(log.node[k])
                held = [j for j in range(2) if log.gpus[k] >> j & 1]
                assert len(held) == g.count  # it got exactly the GPUs it asked for
                for j in held:
                    gpu[i, j] += g.milli
                cpu[i] += pods[k].request.cpu_milli
        assert (gpu <= 1000).all() and (cpu <= 16_000).all(), t
    # Nobody starts before it exists, and the log's allocation matches the pods running.
    assert (log.start[ran] >= log.created[ran]).all()
