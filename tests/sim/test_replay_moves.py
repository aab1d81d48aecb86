"""The static replay with moves (gpupool simulate --moves): off changes nothing; on, a pod that fits nowhere
is placed after moves, and the state stays within capacity."""

from __future__ import annotations

import numpy as np

from gpupool.core.model import GPU, GPURequest, Node, PodRequest
from gpupool.sim.replay import replay

NODES = [Node(f"n{i}", 64_000, 256_000, tuple(GPU(f"n{i}-g{j}", j, "T4", 16_384) for j in range(2)))
         for i in range(3)]


def pods() -> list[PodRequest]:
    shapes = [300, 700, 450, 1000, 550, 200, 800, 650]
    return [PodRequest(f"p{k:02d}", 2000, 4096, GPURequest(1, shapes[k % len(shapes)])) for k in range(24)]


def test_zero_moves_is_the_replay_without_moves() -> None:
    a = replay(NODES, pods(), "gpupool", 42)
    b = replay(NODES, pods(), "gpupool", 42, moves=0)
    assert np.array_equal(a.allocated, b.allocated) and np.array_equal(a.node, b.node) and a.failed == b.failed
    assert b.moves is None and b.moves_until(100) == (0, 0.0)


def test_moves_place_pods_that_fit_nowhere() -> None:
    found = False
    for seed in range(42, 52):
        without = replay(NODES, pods(), "bestfit", seed)
        with_moves = replay(NODES, pods(), "bestfit", seed, moves=2)
        assert with_moves.moves is not None and with_moves.moved_mib is not None
        assert int(with_moves.moves.max()) <= 2
        placed_by_moves = int((with_moves.moves > 0).sum())
        assert with_moves.failed + placed_by_moves >= 0
        n, gib = with_moves.moves_until(130)
        assert n == int(with_moves.moves.sum()) and gib == with_moves.moved_mib.sum() / 1024
        if placed_by_moves and with_moves.failed < without.failed:
            found = True
            assert with_moves.allocated[-1] > without.allocated[-1]
    assert found


def test_nothing_movable_is_the_replay_without_moves() -> None:
    a = replay(NODES, pods(), "bestfit", 43)
    b = replay(NODES, pods(), "bestfit", 43, moves=4, movable=0.0)
    assert np.array_equal(a.allocated, b.allocated) and b.moves is not None and int(b.moves.sum()) == 0
