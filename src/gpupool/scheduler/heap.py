"""The garbage collector in a process that caches a whole cluster (the scheduler).

The scheduler keeps every node and pod as decoded JSON, about 90 objects the collector tracks per pod, and
CPython's full collection walks every tracked object: with 5,000 pods and nodes about 480,000, a pause of
0.44-0.51 s here (2 cores) in which no extender call is answered. It comes back whenever enough new
objects have survived: twice in 600 filter + prioritize calls at 5,000 nodes, a p99 of seconds.

`keep_frozen` collects once and moves everything alive into the permanent generation, which later
collections skip, and does the same after every full collection; so each object is walked by at most one
full pass, and a pass walks only what survived since the previous one. Refcounting still frees a frozen
object once nothing refers to it (a pod replaced by its next version, a deleted node).

The price: a reference cycle that is alive at a freeze and becomes garbage later is not collected while it
stays frozen. Decoded API objects and the ledger's entries form no cycles; what does (tasks, futures,
exceptions with tracebacks) mostly dies young and is collected before it is frozen, but what is in flight
at a freeze is frozen with the rest. So the frozen part is not allowed to grow without bound: once the
survivors frozen since the last pass that walked everything outnumber `regrow - 1` times what that pass
left alive, the frozen part is handed back to the collector, whose next full pass walks everything once
(one long pause), collects the cycles that died frozen, and freezes the survivors again. With the default
`regrow` 2, frozen garbage stays below twice the live heap, and such a pass comes after as many new
survivors as the heap holds, where CPython's own policy walks everything after a quarter as many.

The collector is the process's, so only a process's entry point (the `gpupool scheduler` command, a
benchmark's child) turns this on; library callers and the test suite keep the default behaviour.
"""

from __future__ import annotations

import gc
from typing import Any


class _Freezer:
    def __init__(self, regrow: float) -> None:
        self.regrow = regrow
        # Counting the frozen part walks all of it (80 ms at 480,000 objects here): done here, never in the
        # callback, which counts only the survivors it freezes.
        self.baseline = gc.get_freeze_count()  # what the last pass that walked everything left alive
        self.since = 0  # survivors frozen after that pass
        self.walked_all = False  # the frozen part was handed back: the next full pass walks everything
        self.handed_back = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "stop" or info.get("generation") != 2:
            return
        survivors = len(gc.get_objects(generation=2))  # the rest is frozen already: a short list
        gc.freeze()  # no later pass walks these again
        if self.walked_all:
            self.walked_all = False
            self.baseline, self.since = survivors, 0
            return
        self.since += survivors
        if self.since > (self.regrow - 1) * self.baseline:
            gc.unfreeze()
            self.walked_all = True
            self.handed_back += 1


_freezer: _Freezer | None = None


def keep_frozen(regrow: float = 2.0) -> None:
    """Collect and freeze now, and freeze the survivors of every later full collection; hand the frozen part
    back for one full pass once `regrow - 1` times as many survivors as the last such pass left alive have
    been frozen since it."""
    global _freezer
    if regrow <= 1:
        raise ValueError(f"regrow must be above 1, not {regrow}")
    stop_freezing()
    gc.collect()
    gc.freeze()
    _freezer = _Freezer(regrow)
    gc.callbacks.append(_freezer)


def handed_back() -> int:
    """How many times the frozen part was handed back to the collector (0 when not freezing)."""
    return _freezer.handed_back if _freezer is not None else 0


def stop_freezing() -> None:
    """Back to the collector's default behaviour (frozen objects become collectable again)."""
    global _freezer
    if _freezer is not None and _freezer in gc.callbacks:
        gc.callbacks.remove(_freezer)
    _freezer = None
    gc.unfreeze()
