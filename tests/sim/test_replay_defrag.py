"""The static replay with the background defragmenter (gpupool.sim.replay.DefragPolicy): never due changes
nothing; due, its rounds stay within their budget, are counted as moves, and keep the log consistent."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.core.model import GPU, GPURequest, Node, PodRequest
from gpupool.sim.replay import DefragPolicy, replay, setup

NODES = [Node(f"n{i}", 64_000, 256_000, tuple(GPU(f"n{i}-g{j}", j, "T4", 16_384) for j in range(2)))
         for i in range(3)]


def pods() -> list[PodRequest]:
    shapes = [300, 700, 450, 1000, 550, 200, 800, 650, 150, 250]
    return [PodRequest(f"p{k:02d}", 2000, 4096, GPURequest(1, shapes[k % len(shapes)])) for k in range(30)]


@pytest.mark.parametrize("bad", [dict(interval=0), dict(threshold=1.5), dict(max_moves=-1), dict(max_gib=-1.0)])
def test_bad_settings_are_refused_naming_them(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="defragmenter: interval"):
        DefragPolicy(**bad)  # type: ignore[arg-type]


def test_a_defragmenter_never_due_is_the_replay_without_it() -> None:
    a = replay(NODES, pods(), "firstfit", 42)
    b = replay(NODES, pods(), "firstfit", 42, defrag=DefragPolicy(interval=1, threshold=1.0))
    assert a.node is not None and b.node is not None and b.moves is not None
    assert np.array_equal(a.allocated, b.allocated) and np.array_equal(a.node, b.node) and a.failed == b.failed
    assert int(b.moves.sum()) == 0


def test_rounds_stay_in_budget_and_the_log_stays_consistent() -> None:
    moved_somewhere = False
    for seed in range(42, 52):
        log = replay(NODES, pods(), "random", seed, defrag=DefragPolicy(interval=1, threshold=0.0, max_moves=2))
        assert log.moves is not None and log.moved_mib is not None and log.node is not None and log.gpus is not None
        assert int(log.moves.max()) <= 2  # no make-room moves: every move is a round's
        n, gib = log.moves_until(130)
        assert n == int(log.moves.sum()) and gib == log.moved_mib.sum() / 1024
        assert int(log.allocated.max()) <= log.capacity_milli
        placed = np.flatnonzero(log.node >= 0)
        assert len(placed) + log.failed == len(log.node)
        # every placed one-GPU pod is logged on exactly one GPU, where it is after the rounds: no GPU holds more
        # than its compute, and the logged pods hold what the replay counts as allocated
        assert all(bin(int(log.gpus[k])).count("1") == 1 for k in placed)
        submitted = setup(NODES, pods(), seed).submitted
        used = np.zeros((len(NODES), 2), dtype=np.int64)
        for k in placed:
            used[int(log.node[k]), int(log.gpus[k]).bit_length() - 1] += submitted[k].gpu.milli
        assert int(used.max()) <= 1000 and int(used.sum()) == int(log.allocated[-1])
        moved_somewhere = moved_somewhere or n > 0
    assert moved_somewhere


def test_a_budget_of_zero_moves_moves_nothing() -> None:
    log = replay(NODES, pods(), "firstfit", 43, defrag=DefragPolicy(interval=1, threshold=0.0, max_moves=0))
    assert log.moves is not None and int(log.moves.sum()) == 0
