"""The record of remote share moves (gpupool.api.moves): its format, its states, and where a share is
held and served from in each."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gpupool.api.moves import (
    STATES,
    GpuRef,
    Move,
    MoveError,
    holding,
    new_move,
    read_moves,
    served_from,
)

A0, B1, C2 = GpuRef("node-a", 0), GpuRef("node-b", 1), GpuRef("node-c", 2)


def test_a_gpu_is_written_and_read_as_node_slash_device() -> None:
    assert str(B1) == "node-b/gpu-1"
    assert GpuRef.parse("node-b/gpu-1") == B1
    assert GpuRef.parse("127.0.0.1/3") == GpuRef("127.0.0.1", 3)
    for bad in ("node-b", "/gpu-1", "node-b/gpu-x", "node-b/", ""):
        with pytest.raises(MoveError, match="NODE/gpu-<index>"):
            GpuRef.parse(bad)


def test_a_move_survives_its_json_and_damaged_entries_are_skipped() -> None:
    move = new_move("ns/claim", A0, B1, 1_800_000_000.0)
    assert Move.from_json(move.to_json()) == move
    assert (move.requested_at, move.deadline) == ("2027-01-15T08:00:00Z", "2027-01-15T08:10:00Z")  # + 600 s
    moves = read_moves({"data": {"uid-1": move.to_json(), "uid-2": "{not json", "uid-3": '{"claim": "x"}',
                                 "uid-4": move.to_json().replace('"requested"', '"sideways"')}})
    assert moves == {"uid-1": move}
    assert read_moves(None) == {} and read_moves({"data": None}) == {}


def test_a_move_only_goes_forward() -> None:
    move = new_move("ns/claim", A0, B1, 0.0)
    ready = move.advanced("ready")
    assert ready.state == "ready" and ready.advanced("moved").finished
    assert move.advanced("failed", "no GPU 1 on node-b").reason == "no GPU 1 on node-b"
    for start, to in (("requested", "moved"), ("ready", "requested"), ("moved", "failed"), ("failed", "ready")):
        with pytest.raises(MoveError, match=f"is {start}: it cannot become {to}"):
            Move("ns/claim", A0, B1, start).advanced(to)
    with pytest.raises(MoveError, match="already served from node-a/gpu-0"):
        new_move("ns/claim", A0, A0, 0.0)
    with pytest.raises(MoveError, match="deadline must be after its request"):
        new_move("ns/claim", A0, B1, 0.0, deadline_s=0)


def test_an_entry_written_before_deadlines_existed_still_reads() -> None:
    old = '{"claim": "ns/c", "source": "node-a/gpu-0", "target": "node-b/gpu-1", "state": "ready", ' \
          '"reason": "", "requested_at": "2026-11-27T18:00:00Z"}'
    move = Move.from_json(old)
    assert move.deadline == "" and move.state == "ready"
    # bounded from its request: 2026-11-27T18:00:00Z is 20784 days and 18 h after the epoch, + the default 600 s
    assert move.deadline_at() == 1_795_802_400.0 + 600
    assert move.deadline_at(60) == 1_795_802_460.0
    assert Move("ns/c", A0, B1, "ready").deadline_at() is None  # no time at all: never cancelled by time
    assert Move("ns/c", A0, B1, "ready", requested_at="garbage").deadline_at() is None


def test_a_move_expires_only_unfinished_and_past_its_deadline() -> None:
    move = new_move("ns/claim", A0, B1, 1000.0, deadline_s=30)
    assert move.deadline_at() == 1030.0
    assert not move.expired(1029.0) and move.expired(1030.0) and move.expired(5000.0)
    assert move.advanced("ready").expired(1030.0)
    assert not move.advanced("ready").advanced("moved").expired(5000.0)
    assert not move.advanced("failed", "x").expired(5000.0)


def test_a_cancelled_move_fails_back_to_its_source() -> None:
    ready = new_move("ns/claim", A0, B1, 1000.0).advanced("ready")
    cancelled = ready.cancel("its deadline passed")
    assert (cancelled.state, cancelled.reason) == ("failed", "cancelled: its deadline passed")
    assert cancelled.cancelled and cancelled.finished and not ready.advanced("failed", "x").cancelled
    # as any failed move: held and served at the source only (the target is no longer counted)
    assert holding(cancelled, A0) == (A0,) and served_from(cancelled, A0) == A0
    assert Move.from_json(cancelled.to_json()) == cancelled
    for done in (cancelled, ready.advanced("moved")):
        with pytest.raises(MoveError, match="already: there is nothing to cancel"):
            done.cancel("again")


def test_where_a_share_is_held_and_served_in_each_state() -> None:
    assert holding(None, A0) == (A0,) and served_from(None, A0) == A0
    expected = {"requested": ((A0,), A0), "ready": ((A0, B1), B1), "moved": ((B1,), B1), "failed": ((A0,), A0)}
    for state, (held, served) in expected.items():
        move = Move("ns/claim", A0, B1, state)
        assert (holding(move, A0), served_from(move, A0)) == (held, served), state
    # a second move starts where the first ended: the allocation (A0) no longer decides
    second = Move("ns/claim", B1, C2, "ready")
    assert holding(second, A0) == (B1, C2) and served_from(second, A0) == C2


gpus = st.builds(GpuRef, st.sampled_from(["n1", "n2", "n3"]), st.integers(0, 3))


@given(placed=gpus, source=gpus, target=gpus, state=st.sampled_from(STATES))
def test_a_share_is_always_held_on_one_or_two_gpus_and_served_from_one_of_them(
        placed: GpuRef, source: GpuRef, target: GpuRef, state: str) -> None:
    assume(source != target)  # new_move refuses it
    move = Move("ns/claim", source, target, state)
    held = holding(move, placed)
    assert 1 <= len(held) <= 2 and len(set(held)) == len(held)
    assert served_from(move, placed) in held
    assert (target in held) == (state in ("ready", "moved"))
