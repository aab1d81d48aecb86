"""The allocation ledger: which pod holds which GPU share, derived from API objects.

Truth lives in the API server: a pod *counts* when it is bound (spec.nodeName), not terminal, and carries
a `gpupool.io/allocation` annotation written for its own UID and node. The ledger mirrors exactly that
(`confirmed` entries) plus *assumed* entries for binds in flight. Assumed entries are confirmed when the
watch shows the pod bound with the same allocation, and forgotten when the bind fails or their deadline
passes. Capacity is consumed through `ClusterState.allocate`, which refuses anything over capacity.

`recompute` rebuilds the same view from API objects alone; `diff` compares the two (the invariant
checker behind the debug endpoint and the tests).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gpupool.api.allocation import AllocationError, decode_allocation
from gpupool.api.inventory import InventoryError, node_from_object
from gpupool.api.names import ANN_ALLOCATION, ANN_INVENTORY
from gpupool.api.pod import parse_pod, pod_key
from gpupool.core.model import Allocation, Node, PodRequest
from gpupool.core.state import ClusterState

log = logging.getLogger(__name__)

TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass(slots=True)
class Entry:
    uid: str
    key: str  # namespace/name, for people
    request: PodRequest  # key = uid inside the ClusterState
    allocation: Allocation  # pod = uid
    assumed: bool
    deadline: float = 0.0  # assumed entries are forgotten after this time


@dataclass(frozen=True, slots=True)
class Counted:
    """A pod that holds capacity according to the API objects."""

    uid: str
    key: str
    request: PodRequest
    allocation: Allocation


def grants_signature(a: Allocation) -> tuple[str, tuple[tuple[str, int, int, int], ...]]:
    return a.node, tuple(sorted((g.uuid, g.index, g.milli, g.memory_mib) for g in a.grants))


def counted_allocation(pod: Mapping[str, Any]) -> Counted | None:
    """The capacity `pod` holds according to the API, or None."""
    meta = pod.get("metadata") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    text = (meta.get("annotations") or {}).get(ANN_ALLOCATION)
    if not node or not text or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
        return None
    uid = str(meta.get("uid", ""))
    try:
        doc = decode_allocation(text)
    except AllocationError as e:
        log.warning("pod %s: ignoring allocation annotation: %s", pod_key(pod), e)
        return None
    if doc.pod_uid != uid or doc.node != node:
        # Written for an earlier pod of the same name, or for another node: it grants nothing.
        return None
    parsed = parse_pod(pod)
    request = parsed.request or PodRequest(key=uid)
    return Counted(uid, pod_key(pod), replace(request, key=uid), doc.allocation(uid))


def nodes_from_objects(objs: Iterable[Mapping[str, Any]]) -> tuple[list[Node], dict[str, str]]:
    """gpupool nodes (those with an inventory) sorted by name, and errors of malformed inventories."""
    nodes: list[Node] = []
    errors: dict[str, str] = {}
    for obj in objs:
        name = str((obj.get("metadata") or {}).get("name", ""))
        try:
            node = node_from_object(obj)
        except InventoryError as e:
            errors[name] = str(e)
            continue
        if node is not None:
            nodes.append(node)
    nodes.sort(key=lambda n: n.name)
    return nodes, errors


def node_signature(obj: Mapping[str, Any]) -> tuple[str, str, str, tuple[tuple[str, str], ...]]:
    """What of a Node object the ledger depends on (a bind-lock change must not rebuild anything)."""
    meta = obj.get("metadata") or {}
    alloc = (obj.get("status") or {}).get("allocatable") or {}
    return (
        str((meta.get("annotations") or {}).get(ANN_INVENTORY, "")),
        str(alloc.get("cpu", "")),
        str(alloc.get("memory", "")),
        tuple(sorted((str(k), str(v)) for k, v in (meta.get("labels") or {}).items())),
    )


@dataclass(slots=True)
class Recomputed:
    """The allocation view derived from API objects only."""

    allocations: dict[str, Counted] = field(default_factory=dict)
    overcommitted: dict[str, str] = field(default_factory=dict)  # uid -> why the API view is over capacity


def recompute(node_objs: Iterable[Mapping[str, Any]], pod_objs: Iterable[Mapping[str, Any]]) -> Recomputed:
    nodes, _ = nodes_from_objects(node_objs)
    state = ClusterState(nodes)
    out = Recomputed()
    for pod in pod_objs:
        c = counted_allocation(pod)
        if c is None:
            continue
        out.allocations[c.uid] = c
        refused = state.allocate(c.request, c.allocation)
        if refused is not None:
            out.overcommitted[c.uid] = f"{c.key}: {refused}"
    return out


class Ledger:
    """Derived allocation state; all methods are synchronous (called from one event loop)."""

    def __init__(self, node_objs: Iterable[Mapping[str, Any]] = ()) -> None:
        self.entries: dict[str, Entry] = {}
        self.stranded: dict[str, Entry] = {}  # confirmed by the API but refused by capacity or node
        self.node_objs: dict[str, Mapping[str, Any]] = {}
        self._signatures: dict[str, tuple[Any, ...]] = {}
        # Parsed nodes by name with the signature they were parsed from: a rebuild re-reads only the
        # nodes that changed (decoding thousands of inventories took most of a rebuild's time).
        self._parsed: dict[str, tuple[tuple[Any, ...], Node | None, str | None]] = {}
        self.node_errors: dict[str, str] = {}
        self.generation = 0  # bumped whenever `state` is replaced
        self.state = ClusterState([])
        self.rank = np.zeros(0, dtype=np.int64)
        for obj in node_objs:
            name = str(obj["metadata"]["name"])
            self.node_objs[name] = obj
            self._signatures[name] = node_signature(obj)
        self._rebuild_state()

    # --- nodes ----------------------------------------------------------------------------------------

    def _node(self, name: str, obj: Mapping[str, Any]) -> tuple[Node | None, str | None]:
        sig = self._signatures[name]
        cached = self._parsed.get(name)
        if cached is not None and cached[0] == sig:
            return cached[1], cached[2]
        try:
            node, error = node_from_object(obj), None
        except InventoryError as e:
            node, error = None, str(e)
        self._parsed[name] = (sig, node, error)
        return node, error

    def _rebuild_state(self) -> None:
        nodes: list[Node] = []
        self.node_errors = {}
        for name, obj in self.node_objs.items():
            node, error = self._node(name, obj)
            if error is not None:
                self.node_errors[name] = error
            elif node is not None:
                nodes.append(node)
        for gone in set(self._parsed) - set(self.node_objs):
            del self._parsed[gone]
        nodes.sort(key=lambda n: n.name)
        self.state = ClusterState(nodes)
        self.rank = np.arange(len(nodes), dtype=np.int64)
        self.generation += 1
        entries = sorted(self.entries.values(), key=lambda e: e.assumed)  # confirmed ones first
        entries += list(self.stranded.values())
        self.entries, self.stranded = {}, {}
        for e in entries:
            refused = self.state.allocate(e.request, e.allocation)
            if refused is None:
                self.entries[e.uid] = e
            elif not e.assumed:
                log.warning("pod %s no longer fits after a node change: %s", e.key, refused)
                self.stranded[e.uid] = e

    def apply_node(self, event_type: str, obj: Mapping[str, Any]) -> bool:
        """Apply a node watch event; returns True when the capacity view was rebuilt."""
        name = str(obj["metadata"]["name"])
        if event_type == "DELETED":
            if name not in self.node_objs:
                return False
            del self.node_objs[name]
            self._signatures.pop(name, None)
        else:
            sig = node_signature(obj)
            self.node_objs[name] = obj
            if self._signatures.get(name) == sig:
                return False
            self._signatures[name] = sig
        self._rebuild_state()
        return True

    def replace_nodes(self, objs: Iterable[Mapping[str, Any]]) -> None:
        self.node_objs = {str(o["metadata"]["name"]): o for o in objs}
        self._signatures = {n: node_signature(o) for n, o in self.node_objs.items()}
        self._rebuild_state()

    # --- pods -----------------------------------------------------------------------------------------

    def _take(self, entry: Entry) -> str | None:
        refused = self.state.allocate(entry.request, entry.allocation)
        if refused is None:
            self.entries[entry.uid] = entry
        return refused

    def release(self, uid: str) -> Entry | None:
        self.stranded.pop(uid, None)
        entry = self.entries.pop(uid, None)
        if entry is not None:
            self.state.release(uid)
        return entry

    def assume(self, uid: str, key: str, request: PodRequest, allocation: Allocation, deadline: float) -> str | None:
        """Reserve capacity for a bind in flight. Returns None, or why it cannot be reserved."""
        if uid in self.entries:
            return f"pod {key} already holds an allocation on {self.entries[uid].allocation.node}"
        return self._take(Entry(uid, key, replace(request, key=uid), replace(allocation, pod=uid), True, deadline))

    def forget(self, uid: str) -> None:
        """Drop an assumed entry (bind failed); a confirmed entry stays."""
        entry = self.entries.get(uid)
        if entry is not None and entry.assumed:
            self.release(uid)

    def expire(self, now: float) -> list[Entry]:
        """Forget assumed entries whose deadline passed."""
        stale = [e for e in self.entries.values() if e.assumed and e.deadline <= now]
        for e in stale:
            log.warning("forgetting assumed allocation of %s on %s: not confirmed in time", e.key, e.allocation.node)
            self.release(e.uid)
        return stale

    def apply_pod(self, event_type: str, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        if event_type == "DELETED" or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            self.release(uid)
            return
        counted = counted_allocation(pod)
        entry = self.entries.get(uid)
        if counted is None:
            # Not (yet) bound with an allocation. An assumed entry waits for its bind; a confirmed one
            # lost its annotation and no longer holds anything.
            if entry is not None and not entry.assumed:
                self.release(uid)
            return
        if entry is not None and grants_signature(entry.allocation) == grants_signature(counted.allocation):
            entry.assumed = False
            return
        if entry is not None or uid in self.stranded:
            self.release(uid)
        new = Entry(uid, counted.key, counted.request, counted.allocation, False)
        refused = self._take(new)
        if refused is not None:
            log.error("pod %s is bound with an allocation that exceeds capacity: %s", counted.key, refused)
            self.stranded[uid] = new

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Resynchronise with a fresh pod list: confirmed entries are rebuilt from it; assumed entries
        survive only while their pod still exists."""
        pods = list(pods)
        alive = {str((p.get("metadata") or {}).get("uid", "")) for p in pods}
        for uid, e in list(self.entries.items()):
            if not e.assumed or uid not in alive:
                self.release(uid)
        self.stranded.clear()
        for p in pods:
            self.apply_pod("ADDED", p)

    # --- inspection -----------------------------------------------------------------------------------

    def confirmed(self) -> dict[str, Entry]:
        return {u: e for u, e in self.entries.items() if not e.assumed}

    def assumed(self) -> dict[str, Entry]:
        return {u: e for u, e in self.entries.items() if e.assumed}

    def diff(self, truth: Recomputed) -> dict[str, list[str]]:
        """Differences between the ledger and a recomputation from API objects. Assumed entries the API
        does not show yet are binds in flight, not differences."""
        missing, extra, different = [], [], []
        for uid, c in truth.allocations.items():
            e = self.entries.get(uid)
            if e is None:
                missing.append(f"{c.key} ({uid}) holds {_fmt(c.allocation)} in the API but not in the ledger")
            elif grants_signature(e.allocation) != grants_signature(c.allocation):
                different.append(f"{c.key}: ledger {_fmt(e.allocation)} != API {_fmt(c.allocation)}")
        for uid, e in self.entries.items():
            if uid not in truth.allocations and not e.assumed:
                extra.append(f"{e.key} ({uid}) holds {_fmt(e.allocation)} in the ledger but not in the API")
        return {
            "missing": missing,
            "extra": extra,
            "different": different,
            "overcommitted": sorted(truth.overcommitted.values()),
        }

    def dump(self) -> dict[str, Any]:
        def one(e: Entry) -> dict[str, Any]:
            return {
                "pod": e.key,
                "uid": e.uid,
                "node": e.allocation.node,
                "state": "assumed" if e.assumed else "confirmed",
                "policy": e.allocation.policy,
                "gpus": [
                    {"uuid": g.uuid, "index": g.index, "cores": g.milli / 10, "memory_mib": g.memory_mib}
                    for g in e.allocation.grants
                ],
            }

        return {
            "nodes": len(self.state),
            "gpus": self.state.total_gpus,
            "entries": [one(e) for e in sorted(self.entries.values(), key=lambda e: e.key)],
            "stranded": [one(e) for e in self.stranded.values()],
            "node_errors": dict(self.node_errors),
        }


def _fmt(a: Allocation) -> str:
    gpus = ",".join(f"{g.index}:{g.milli / 10:g}%/{g.memory_mib}Mi" for g in a.grants)
    return f"{a.node}[{gpus}]"
