"""`counted_claim` with a move (gpupool.api.moves): a remote share counts on the GPUs that hold it, both while
the move is `ready`; an entry for anything but a one-GPU remote share moves nothing."""

from __future__ import annotations

from typing import Any

from gpupool.api.dra import DRIVER, MOVING_SUFFIX, counted_claim
from gpupool.api.moves import GpuRef, Move
from gpupool.core.model import GPU, Node
from gpupool.core.state import ClusterState

STATE = ClusterState([Node(n, 64_000, 256_000, tuple(GPU(f"{n}-GPU-{i}", i, "L40S", 46068) for i in range(2)))
                      for n in ("a", "b")])


def claim(isolation: str = "remote", devices: int = 1) -> dict[str, Any]:
    results = [{"request": "gpu", "driver": DRIVER, "pool": "a", "device": f"gpu-{i}",
                "consumedCapacity": {"memory": "8Gi", "cores": "30"}} for i in range(devices)]
    config = [{"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"isolation": isolation}}}]
    return {"metadata": {"name": "c", "namespace": "t", "uid": "u1"},
            "status": {"allocation": {"devices": {"results": results, "config": config}}}}


def places(move: Move | None, isolation: str = "remote", devices: int = 1) -> list[tuple[str, str, int, int, int]]:
    return [(c.uid, c.allocation.node, g.index, g.milli, g.memory_mib)
            for c in counted_claim(claim(isolation, devices), STATE, move) for g in c.allocation.grants]


def move(state: str) -> Move:
    return Move("t/c", GpuRef("a", 0), GpuRef("b", 1), state)


def test_a_moving_remote_share_counts_where_it_is_held() -> None:
    share = (300, 8192)  # 30 % and 8 GiB on each GPU that holds it
    assert places(None) == [("u1", "a", 0, *share)]
    assert places(move("requested")) == [("u1", "a", 0, *share)]
    # ready: new clients go to the target (the claim's UID), the source still holds it (the second key)
    assert places(move("ready")) == [("u1" + MOVING_SUFFIX, "a", 0, *share), ("u1", "b", 1, *share)]
    assert places(move("moved")) == [("u1", "b", 1, *share)]
    assert places(move("failed")) == [("u1", "a", 0, *share)]
    # the UUID is the target's GPU's
    (_, target) = counted_claim(claim(), STATE, move("ready"))
    assert target.uid == "u1"
    assert target.allocation.grants[0].uuid == "b-GPU-1" and target.claim and target.key == "t/c"


def test_a_second_move_starts_where_the_first_ended() -> None:
    again = Move("t/c", GpuRef("b", 1), GpuRef("a", 1), "requested")
    assert places(again) == [("u1", "b", 1, 300, 8192)]


def test_a_move_of_anything_but_a_one_gpu_remote_share_is_ignored() -> None:
    assert places(move("moved"), isolation="hook") == [("u1", "a", 0, 300, 8192)]
    assert places(move("moved"), devices=2) == [("u1", "a", 0, 300, 8192), ("u1", "a", 1, 300, 8192)]


def test_an_unallocated_claim_counts_nowhere_whatever_its_move() -> None:
    bare = {"metadata": {"name": "c", "namespace": "t", "uid": "u1"}, "status": {}}
    assert counted_claim(bare, STATE, move("ready")) == ()
