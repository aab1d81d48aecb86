"""Nodes with a GPU pod between scheduling and its device allocation ("busy" nodes).

Kubelet's device-plugin Allocate does not say which pod it is for; the node agent takes it to be for the
only pod bound to the node that still waits for one, and refuses when there are several (gpupool.agent.
identify). So the scheduler binds at most one GPU pod per node at a time: a node is *bound-busy* from the
bind's Permit until its pod is seen served (Running or finished, being deleted or deleted, or carrying
`gpupool.io/allocated`), or until `lock_timeout_s` after its bind (a kubelet that never calls must not
close the node for good; the agent then refuses the ambiguous call rather than guess). That rule is kept
here, from the pod watch and this process's own binds, with no API write: taking it on the Node object
cost 13-16 ms of CPU per pod across the control plane (docs/scheduler.md, Performance).

A node is also *nominated-busy* from the moment prioritize picks it for a pod until that pod is bound or
its nomination ends: a policy that packs sends a burst of pods to one node, which would then go one per
Allocate; Prioritize steers the winner to the best node that is not busy, when one fits.

Every hold has a deadline, so a missed event costs at most a detour, never a stuck node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.times import parse_time
from gpupool.api.waiting import awaits_allocate, waiting_for_allocate


@dataclass(slots=True)
class Hold:
    node: str
    until: float
    key: str = ""  # namespace/name, for the messages of a bound hold
    since: float = 0.0  # when its bind was decided (bound holds)
    bound: bool = False  # the pod was bound (or is being bound) to the node, else only nominated


class BusyNodes:
    def __init__(self, lock_timeout_s: float) -> None:
        self.lock_timeout_s = lock_timeout_s
        self._holds: dict[str, Hold] = {}  # pod uid -> hold

    def nominated(self, uid: str, node: str, until: float) -> None:
        hold = self._holds.get(uid)
        if hold is None or not hold.bound:
            self._holds[uid] = Hold(node, until)

    def bound(self, uid: str, key: str, node: str, now: float) -> None:
        self._holds[uid] = Hold(node, now + self.lock_timeout_s, key, now, bound=True)

    def forget_nomination(self, uid: str) -> None:
        """The pod's scheduling cycle ended without a bind: its nomination no longer holds the node. A bound
        hold stays (a failed bind of a pod that is bound already, say to another node, changes nothing)."""
        hold = self._holds.get(uid)
        if hold is not None and not hold.bound:
            del self._holds[uid]

    def unbind(self, uid: str) -> None:
        """The bind that took the node for the pod failed after it: the node is free again."""
        self._holds.pop(uid, None)

    def bound_to(self, uid: str) -> str | None:
        hold = self._holds.get(uid)
        return hold.node if hold is not None and hold.bound else None

    def names(self, now: float, other_than: str = "") -> set[str]:
        """Nodes held by some pod other than the one with UID `other_than` (its own nomination is no
        reason to steer it elsewhere when it is scheduled again)."""
        self._expire(now)
        return {h.node for uid, h in self._holds.items() if uid != other_than}

    def waiting_on(self, node: str, now: float, other_than: str) -> Hold | None:
        """A pod other than `other_than` bound to `node` and still waiting for its device allocation."""
        self._expire(now)
        return next((h for uid, h in self._holds.items() if h.bound and h.node == node and uid != other_than),
                    None)

    def _expire(self, now: float) -> None:
        for uid in [uid for uid, h in self._holds.items() if h.until <= now]:
            del self._holds[uid]

    def on_pod(self, event_type: str, pod: Mapping[str, Any]) -> str | None:
        """Follow a pod event; returns the node the pod stopped holding, if it did."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        hold = self._holds.get(uid)
        if event_type == "DELETED" or not awaits_allocate(pod):  # served, or never will be
            if hold is None:
                return None
            del self._holds[uid]
            return hold.node
        if hold is None or not hold.bound:
            self._adopt(uid, pod)  # bound by an earlier run of the scheduler (or its previous leader)
        return None

    def replace(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """After a (re)list: bound holds follow the listed pods; pods gone from the list free their node."""
        listed: set[str] = set()
        for pod in pods:
            uid = str((pod.get("metadata") or {}).get("uid", ""))
            listed.add(uid)
            self.on_pod("MODIFIED", pod)
        for uid in [uid for uid, h in self._holds.items() if h.bound and uid not in listed]:
            del self._holds[uid]

    def _adopt(self, uid: str, pod: Mapping[str, Any]) -> None:
        node = (pod.get("spec") or {}).get("nodeName")
        doc = waiting_for_allocate(pod, node) if node else None
        if doc is None:
            return  # not bound, or without a readable allocation for its node: the agent would refuse it
        since = parse_time(doc.time)
        meta = pod.get("metadata") or {}
        self._holds[uid] = Hold(str(node), since + self.lock_timeout_s, f"{meta.get('namespace')}/{meta.get('name')}",
                                since, bound=True)
