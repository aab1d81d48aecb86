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
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from gpupool.api.dra import device_index, device_name

MOVES_CONFIGMAP = "gpupool-remote-moves"
STATES = ("requested", "ready", "moved", "failed")
# Entries kept: about 220 bytes each, and a ConfigMap holds at most 1 MiB. Only entries of claims that no
# longer exist are dropped to make room (gpupool migrate): a live claim's entry says where its share is.
MAX_MOVES = 3000


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
                        str(doc.get("requested_at", "")))
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


def new_move(claim: str, source: GpuRef, target: GpuRef, now: str) -> Move:
    if source == target:
        raise MoveError(f"the share of {claim} is already served from {target}")
    return Move(claim, source, target, "requested", "", now)


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
