"""Nodes with a GPU pod between scheduling and its device allocation ("busy" nodes).

A node's bind lock admits one such pod at a time (gpupool.api.lock): a second bind to a busy node waits
until the agent's Allocate (or the pod running) frees the lock. A policy that packs sends a burst of pods
to the same node, so the burst would go one pod per lock hand-over. Prioritize therefore steers the winner
to the best node that is not busy, when there is one; the busy node gets the next pod once it is free.

A node is busy from the moment a pod is nominated for it (prioritize picked it) until that pod is known to
be served: Running or finished, deleted, `gpupool.io/allocated` set, or the node's lock gone or naming
another pod. Every hold also has a deadline, so a missed event costs at most a detour, never a stuck node.

Pods seen served are remembered until their hold's deadline: the next bind to the node can then take the
lock over without asking the API server about the holder.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.lock import ANN_BIND_LOCK, LockError, decode_lock
from gpupool.api.names import ANN_ALLOCATED

SERVED_PHASES = ("Running", "Succeeded", "Failed")


@dataclass(slots=True)
class Hold:
    node: str
    until: float
    locked: bool  # the pod's bind took the node lock (else only nominated)


class BusyNodes:
    def __init__(self) -> None:
        self._holds: dict[str, Hold] = {}  # pod uid -> hold
        self._served: dict[str, float] = {}  # pod uid -> until when to remember it

    def nominated(self, uid: str, node: str, until: float) -> None:
        self._holds[uid] = Hold(node, until, locked=False)

    def locked(self, uid: str, node: str, until: float) -> None:
        self._holds[uid] = Hold(node, until, locked=True)

    def release(self, uid: str) -> None:
        self._holds.pop(uid, None)

    def names(self, now: float) -> set[str]:
        for uid in [uid for uid, h in self._holds.items() if h.until <= now]:
            del self._holds[uid]
        return {h.node for h in self._holds.values()}

    def was_served(self, uid: str, now: float) -> bool:
        """Whether this process saw the pod served (its device allocation done) recently."""
        # Deadlines are set in the order pods are seen served, so the oldest come first.
        while self._served:
            first = next(iter(self._served))
            if self._served[first] > now:
                break
            del self._served[first]
        return uid in self._served

    def on_pod(self, event_type: str, pod: Mapping[str, Any]) -> str | None:
        """Follow a pod event; returns the node the pod stopped holding, if it did."""
        meta = pod.get("metadata") or {}
        hold = self._holds.get(str(meta.get("uid", "")))
        if hold is None:
            return None
        served = (
            event_type == "DELETED"
            or bool(meta.get("deletionTimestamp"))
            or (pod.get("status") or {}).get("phase") in SERVED_PHASES
            or ANN_ALLOCATED in (meta.get("annotations") or {})
        )
        if not served:
            return None
        del self._holds[str(meta["uid"])]
        self._served[str(meta["uid"])] = hold.until
        return hold.node

    def on_node(self, node: Mapping[str, Any]) -> None:
        """Follow a node event: a lock that is gone (or names another pod) frees its locked holder."""
        meta = node.get("metadata") or {}
        name = meta.get("name")
        text = (meta.get("annotations") or {}).get(ANN_BIND_LOCK)
        holder = None
        if text:
            try:
                holder = decode_lock(text).pod_uid
            except LockError:
                holder = None
        for uid in [u for u, h in self._holds.items() if h.locked and h.node == name and u != holder]:
            del self._holds[uid]
