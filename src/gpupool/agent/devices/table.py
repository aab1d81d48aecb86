"""The agent's view of its GPUs: every GPU seen since start, which are present, which are unhealthy.

ListAndWatch streams wait on `changed()`; every change bumps `version` and wakes them. A GPU that
vanishes keeps its slots (reported Unhealthy, so kubelet keeps the capacity but stops allocating them)
until the agent restarts; a new GPU adds slots.

While node validation does not pass (`withheld`, set by the agent from gpupool.agent.state.validation), every
GPU counts as unhealthy with that reason: its slots are reported Unhealthy (kubelet's allocatable drops to
0), Allocate refuses it and the inventory marks it, the same path a GPU fault takes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import replace

from gpupool.agent.devices.discovery import DeviceInfo, Discovered, HealthEvent
from gpupool.agent.devices.health import HealthTracker
from gpupool.agent.devices.slots import Slot, slot_id

NOT_PRESENT = "GPU is no longer reported by discovery"


class DeviceTable:
    def __init__(self, discovered: Discovered, split: int, tracker: HealthTracker) -> None:
        self.split = split
        self.tracker = tracker
        self.discovered = discovered
        self.known: dict[str, DeviceInfo] = {d.uuid: d for d in discovered.devices}
        self.version = 0
        self.withheld: str | None = None  # why node validation keeps every GPU out (None: it does not)
        self._cond = asyncio.Condition()

    # --- reading ------------------------------------------------------------------------------------------
    def slots(self) -> list[Slot]:
        return [
            Slot(slot_id(d.uuid, n), d.uuid, self.withheld is None and self.tracker.healthy(d.uuid), d.numa_node)
            for d in self.known.values()
            for n in range(self.split)
        ]

    def unhealthy(self) -> dict[str, str]:
        faults = {u: f.reason for u, f in self.tracker.faults.items()}
        if self.withheld is not None:  # a GPU's own fault is the more specific reason
            return {u: faults.get(u, self.withheld) for u in self.known}
        return faults

    def inventory_view(self) -> Discovered:
        """Every known GPU (vanished ones too, reported unhealthy), indices 0..n-1 as the schema wants."""
        devices = sorted(self.known.values(), key=lambda d: d.index)
        if [d.index for d in devices] != list(range(len(devices))):
            devices = [replace(d, index=i) for i, d in enumerate(devices)]
        d = self.discovered
        return Discovered(d.vendor, d.driver_version, d.cuda_version, tuple(devices))

    # --- changes ------------------------------------------------------------------------------------------
    async def _bump(self) -> None:
        async with self._cond:
            self.version += 1
            self._cond.notify_all()

    async def wait_changed(self, seen: int, timeout: float | None = None) -> int:
        """Wait until `version` differs from `seen` (or the timeout passes); returns the version."""
        async with self._cond:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancellation that arrives
            # as the condition is notified, and a task stopped here would then never end.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._cond.wait_for(lambda: self.version != seen)
            return self.version

    async def withhold(self, reason: str | None) -> bool:
        """Take every GPU out (`reason`) or give them back (None); True when that changed anything."""
        if reason == self.withheld:
            return False
        self.withheld = reason
        await self._bump()
        return True

    async def apply_event(self, event: HealthEvent, now: float) -> tuple[bool, bool]:
        changed, reprobe_all = self.tracker.on_event(event, self.known, now)
        if changed:
            await self._bump()
        return changed, reprobe_all

    async def mark(self, uuid: str, reason: str, now: float) -> bool:
        if uuid in self.known and self.tracker.mark(uuid, reason, now):
            await self._bump()
            return True
        return False

    async def probe_result(self, uuid: str, problem: str | None, now: float) -> bool:
        if uuid not in {d.uuid for d in self.discovered.devices}:
            problem = problem or NOT_PRESENT  # a vanished GPU cannot recover until discovery sees it again
        if problem is not None:
            return await self.mark(uuid, problem, now)
        if self.tracker.probe_result(uuid, None, now):
            await self._bump()
            return True
        return False

    async def rediscovered(self, discovered: Discovered, now: float) -> bool:
        """Apply a new discovery pass; returns True when the slot list or health changed."""
        changed = False
        present = {d.uuid for d in discovered.devices}
        for d in discovered.devices:
            if d.uuid not in self.known:
                self.known[d.uuid] = d
                changed = True
        self.discovered = Discovered(
            discovered.vendor, discovered.driver_version, discovered.cuda_version, discovered.devices
        )
        for uuid in self.known:
            if uuid not in present:
                changed |= self.tracker.mark(uuid, NOT_PRESENT, now)
        if changed:
            await self._bump()
        return changed

    def uuids(self) -> Iterable[str]:
        return self.known.keys()
