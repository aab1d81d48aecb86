"""Moves of remote shares between GPU servers (issue 30 item 3; docs/remote.md, "Moving a share").

A remote claim's allocation names the GPU its share was placed on, and an allocation cannot change once
written. When an admin moves the share (`gpupool migrate`, `gpupool drain`), where it is served from then on
is recorded here instead: one ConfigMap, `MOVES_CONFIGMAP` in gpupool's own namespace, which tenants cannot
write (they may edit their claims' annotations, so the record cannot live on the claim). One entry per
claim UID, a JSON `Move`.

Who writes what (every writer re-reads and updates with the ConfigMap's resourceVersion):
- `gpupool migrate` / `gpupool drain` (an admin): a new entry, state `requested`;
- the agent of the target GPU node: `ready` once the share's directory and token are in place there (its
  GPU server would admit the claim's client), or `failed` with the reason;
- the agent of the source GPU node: after asking its workers to move (SHARE_DIR/move-to + SIGUSR1), `moved`
  when no worker of the share is left on the source (every live client went over; one that could not move
  ends the move `failed` and keeps being served at the source), then it forgets the share there;
- the agent of each pod's node: keeps the claim's server address file (what new client processes dial) on
  the server the share is served from (`served_from`: the target from `ready` on).

The scheduler's ledger counts the share on the source GPU until the move is `moved`, and on the target GPU
from `ready` on: while the contents are copied both hold it.

A move is bounded: each entry carries a `deadline` (RFC 3339; `gpupool migrate --deadline`, default
DEFAULT_DEADLINE_S after the request). A move still unfinished past it (a target its pod's node cannot reach,
a client that never waits for its GPU work, an agent that is gone) is cancelled by the scheduler's leader
(gpupool.scheduler.moves): it ends `failed` with a reason that starts with CANCELLED, so every agent reads it
as any failed move: the share is served from the source again, the target forgets it, the ledger stops
counting it there. `gpupool migrate --cancel` does the same at once. An entry without a deadline (written
before there were any) is bounded from its `requested_at`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from gpupool.api.dra import device_index, device_name
from gpupool.api.times import format_time, parse_time

MOVES_CONFIGMAP = "gpupool-remote-moves"
STATES = ("requested", "ready", "moved", "failed")
# Entries kept: about 220 bytes each, and a ConfigMap holds at most 1 MiB. Only entries of claims that no
# longer exist are dropped to make room (gpupool migrate): a live claim's entry says where its share is.
MAX_MOVES = 3000
DEFAULT_DEADLINE_S = 600.0  # how long a move may take before it is cancelled (the bound, see the module doc)
CANCELLED = "cancelled: "  # the start of a cancelled move's reason (its state is `failed`)


class MoveError(ValueError):
    """A move that cannot be recorded or read; the message says which and why."""


@dataclass(frozen=True, slots=True)
class GpuRef:
    """One GPU of a node's pool: where a share is served from."""

    node: str
    index: int

    def __str__(self) -> str:
        return f"{self.node}/{device_name(self.index)}"

    @staticmethod
    def parse(text: str) -> GpuRef:
        """`NODE/gpu-<i>` (or `NODE/<i>`); raises MoveError."""
        node, sep, device = text.rpartition("/")
        index = device_index(device) if not device.isdigit() else int(device)
        if not sep or not node or index is None:
            raise MoveError(f"{text!r} is not NODE/gpu-<index>")
        return GpuRef(node, index)


@dataclass(frozen=True, slots=True)
class Move:
    """One claim's share moving from one GPU server to another."""

    claim: str  # namespace/name, for people
    source: GpuRef
    target: GpuRef
    state: str = "requested"
    reason: str = ""  # why it failed (or what it waits for)
    requested_at: str = ""  # RFC 3339
    deadline: str = ""  # RFC 3339: cancelled when still unfinished past it ("": requested_at + the default)

    def to_json(self) -> str:
        doc = asdict(self)
        doc["source"], doc["target"] = str(self.source), str(self.target)
        return json.dumps(doc, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Move:
        try:
            doc = json.loads(text)
            move = Move(str(doc["claim"]), GpuRef.parse(str(doc["source"])), GpuRef.parse(str(doc["target"])),
                        str(doc.get("state", "requested")), str(doc.get("reason", "")),
                        str(doc.get("requested_at", "")), str(doc.get("deadline", "")))
        except (ValueError, KeyError, TypeError) as e:
            raise MoveError(f"not a move record: {e}") from None
        if move.state not in STATES:
            raise MoveError(f"state {move.state!r} is not one of {', '.join(STATES)}")
        return move

    def advanced(self, state: str, reason: str = "") -> Move:
        """The same move in `state`; only forward: requested -> ready -> moved, any unfinished one -> failed."""
        allowed = {"requested": ("ready", "failed"), "ready": ("moved", "failed")}.get(self.state, ())
        if state not in allowed:
            raise MoveError(f"move of {self.claim} is {self.state}: it cannot become {state}")
        return replace(self, state=state, reason=reason)

    @property
    def finished(self) -> bool:
        return self.state in ("moved", "failed")

    @property
    def cancelled(self) -> bool:
        return self.state == "failed" and self.reason.startswith(CANCELLED)

    def deadline_at(self, default_s: float = DEFAULT_DEADLINE_S) -> float | None:
        """The deadline as seconds since the epoch: its own, else `requested_at` + `default_s`; None when
        neither can be read (such an entry is never cancelled by time)."""
        for text, extra in ((self.deadline, 0.0), (self.requested_at, default_s)):
            at = parse_time(text) if text else 0.0
            if at > 0:  # parse_time reads what it cannot parse as 0
                return at + extra
        return None

    def expired(self, now: float, default_s: float = DEFAULT_DEADLINE_S) -> bool:
        """Whether the move is unfinished past its deadline (`now`: seconds since the epoch)."""
        at = self.deadline_at(default_s)
        return not self.finished and at is not None and now >= at

    def cancel(self, why: str) -> Move:
        """The move cancelled: `failed`, its share served from the source again; raises MoveError when it is
        finished already."""
        if self.finished:
            raise MoveError(f"the move of {self.claim} is {self.state} already: there is nothing to cancel")
        return replace(self, state="failed", reason=CANCELLED + why)


def new_move(claim: str, source: GpuRef, target: GpuRef, now: float,
             deadline_s: float = DEFAULT_DEADLINE_S) -> Move:
    """A requested move at `now` (seconds since the epoch), bounded by `deadline_s` seconds."""
    if source == target:
        raise MoveError(f"the share of {claim} is already served from {target}")
    if not deadline_s > 0:
        raise MoveError(f"a move's deadline must be after its request (got {deadline_s:g} s)")
    return Move(claim, source, target, "requested", "", format_time(now), format_time(now + deadline_s))


def read_moves(configmap: Mapping[str, Any] | None) -> dict[str, Move]:
    """Claim UID -> its move, from the ConfigMap (None: no moves). Entries that do not parse are skipped:
    one damaged entry must not hide the others."""
    out = {}
    for uid, text in ((configmap or {}).get("data") or {}).items():
        try:
            out[str(uid)] = Move.from_json(str(text))
        except MoveError:
            continue
    return out


def served_from(move: Move | None, placed: GpuRef) -> GpuRef:
    """Where new clients of a share its allocation placed on `placed` connect: the entry decides once there
    is one (a second move starts from where the first one ended), the target from `ready` on. The target
    admits the share's token from then, and a process that started after the source let the share go
    would find nothing there."""
    if move is None:
        return placed
    return move.target if move.state in ("ready", "moved") else move.source


def holding(move: Move | None, placed: GpuRef) -> tuple[GpuRef, ...]:
    """The GPUs that hold the share now, for the ledger: the source until the move is done, the target from
    `ready` on (both while the contents travel)."""
    if move is None:
        return (placed,)
    if move.state == "ready":
        return (move.source, move.target)
    return (served_from(move, placed),)
