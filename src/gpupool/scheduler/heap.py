"""The garbage collector in a process that caches a whole cluster (the scheduler).

The scheduler keeps every node and pod as decoded JSON, about 90 objects the collector tracks per pod, and
CPython's full collection walks every tracked object: with 5,000 pods and nodes about 480,000, a pause of
0.44-0.51 s here (2 cores) in which no extender call is answered. It comes back whenever enough new
objects have survived: twice in 600 filter + prioritize calls at 5,000 nodes, a p99 of seconds.

`keep_frozen` collects once and moves everything alive into the permanent generation, which later
collections skip, and does the same after every full collection; so each object is walked by at most one
full pass, and a pass walks only what survived since the previous one. Refcounting still frees a frozen
object once nothing refers to it (a pod replaced by its next version, a deleted node).

The price: a reference cycle that is alive at a freeze and becomes garbage later stays in memory. Decoded
API objects and the ledger's entries form no cycles; what does (tasks, exceptions with tracebacks) mostly
dies young and is collected before it is frozen.

The collector is the process's, so only a process's entry point (the `gpupool scheduler` command, a
benchmark's child) turns this on; library callers and the test suite keep the default behaviour.
"""

from __future__ import annotations

import gc
from typing import Any


def _after_collection(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()  # the survivors of this full pass: no later pass walks them again


def keep_frozen() -> None:
    """Collect and freeze now, and freeze the survivors of every later full collection."""
    gc.collect()
    gc.freeze()
    if _after_collection not in gc.callbacks:
        gc.callbacks.append(_after_collection)


def stop_freezing() -> None:
    """Back to the collector's default behaviour (frozen objects become collectable again)."""
    if _after_collection in gc.callbacks:
        gc.callbacks.remove(_after_collection)
    gc.unfreeze()
