"""Which GPUs are unhealthy and why, and when they may come back.

Rules (issue 4; nvidia-facts.md section 4.6):
- a critical Xid on a GPU marks *that* GPU unhealthy, unless the Xid is an application error (ignored);
- an event that cannot be tied to one GPU marks nothing by itself: every GPU is re-probed instead, and
  only those that fail turn unhealthy (one bad event must not take a whole node out);
- a GPU that vanished from discovery is unhealthy ("not present");
- an unhealthy GPU recovers when a probe succeeds at least `quarantine_s` after it was marked.
Pure state: the caller passes the time in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpupool.agent.devices.discovery import HealthEvent


@dataclass(frozen=True, slots=True)
class Fault:
    reason: str
    since: float


class HealthTracker:
    def __init__(self, ignored_xids: Iterable[int], quarantine_s: float) -> None:
        self.ignored_xids = frozenset(ignored_xids)
        self.quarantine_s = quarantine_s
        self.faults: dict[str, Fault] = {}

    def healthy(self, uuid: str) -> bool:
        return uuid not in self.faults

    def on_event(self, event: HealthEvent, known: Iterable[str], now: float) -> tuple[bool, bool]:
        """Apply a driver event. Returns (changed, reprobe_all)."""
        if event.xid in self.ignored_xids:
            return False, False
        if event.uuid is None or event.uuid not in set(known):
            return False, True
        return self.mark(event.uuid, f"Xid {event.xid}" if event.xid >= 0 else event.detail, now), False

    def mark(self, uuid: str, reason: str, now: float) -> bool:
        if uuid in self.faults:
            return False
        self.faults[uuid] = Fault(reason, now)
        return True

    def due_for_probe(self, now: float) -> list[str]:
        return [u for u, f in self.faults.items() if now - f.since >= self.quarantine_s]

    def probe_result(self, uuid: str, problem: str | None, now: float) -> bool:
        """Record a re-probe; returns True when the GPU recovered."""
        fault = self.faults.get(uuid)
        if fault is None:
            return False
        if problem is None and now - fault.since >= self.quarantine_s:
            del self.faults[uuid]
            return True
        return False
