"""The allocation ledger: the assume / confirm / forget store of which pod holds which GPU share.

Truth lives in the API server (gpupool.api.counted: a pod counts when it is bound with an allocation
written for it). The ledger mirrors exactly that (`confirmed` entries) plus *assumed* entries for binds in
flight. Assumed entries are confirmed when the watch shows the pod bound with the same allocation, and
forgotten when the bind fails or their deadline passes. Capacity is consumed through
`ClusterState.allocate`, which refuses anything over capacity.

Shares per GPU: the ledger also counts, per GPU, the pods holding a share of it (and how many of them are
MPS clients), with each node's limit from its inventory (`split`) and MPS_CLIENTS_PER_GPU for MPS. Like
capacity, this limit is a rule of the store: `assume` refuses a grant on a full GPU whatever the profile
(what the API confirms is counted regardless: it is the truth, and the diff reports it), and the
`shares_per_gpu` plugin reads the counts to hide full GPUs from a pod.

DRA claims (ResourceClaims allocated devices of gpupool's driver) are entries like pods, keyed by the
claim's UID, so both forms count against one capacity (gpupool.api.dra.counted_claim reads them). Their
GPUs are named by index in the claim; the UUIDs come from the node's inventory, so the claim objects are
kept and counted again whenever the nodes are rebuilt. A remote claim whose share an admin moves
(gpupool.api.moves: `replace_moves`) counts on the GPUs holding it: its source, and its target too while the
share travels (a second entry, keyed `uid + MOVING_SUFFIX`).

Reading objects is not the ledger's: pods and nodes are read by gpupool.api.counted and
gpupool.api.node_objects, and `gpupool.api.recompute` rebuilds the same view from API objects alone; `diff`
compares the two (the invariant checker behind the debug endpoint and the tests).

State that only one plugin reads lives with that plugin (MIG layouts: gpupool.scheduler.mig_layouts.MigState;
MPS daemon states: the mps_ready plugin), as a `LedgerView` the plugin attaches: the ledger hands it the
inventories it decoded once per node change, and each entry that appears, goes or is replaced.
What-ifs never change the ledger: they ask a snapshot (gpupool.scheduler.what_if).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from gpupool.api.counted import (
    MPS_CLIENTS_PER_GPU,
    TERMINAL_PHASES,
    counted_allocation,
    fmt_allocation,
    grants_signature,
)
from gpupool.api.dra import MOVING_SUFFIX, counted_claim
from gpupool.api.inventory import InventoryDoc, InventoryError, read_node
from gpupool.api.moves import Move
from gpupool.api.node_objects import node_signature
from gpupool.api.preferences import soft_taints
from gpupool.api.recompute import Recomputed
from gpupool.core.model import Allocation, Node, PodRequest
from gpupool.core.state import BoolArray, ClusterState, IntArray

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Entry:
    uid: str
    key: str  # namespace/name, for people
    request: PodRequest  # key = uid inside the ClusterState
    allocation: Allocation  # pod = uid
    assumed: bool
    deadline: float = 0.0  # assumed entries are forgotten after this time
    mps: bool = False  # an MPS client on its GPUs (isolation "mps")
    containers: str = ""  # its GPU containers (Counted.containers), known once the API shows it bound
    claim: bool = False  # a DRA ResourceClaim's share (gpupool.api.dra.counted_claim), uid = the claim's


class LedgerView(Protocol):
    """State a plugin derives from the ledger and keeps itself (see the module doc)."""

    def nodes_changed(self, state: ClusterState, inventories: Mapping[str, InventoryDoc]) -> None:
        """The ledger's nodes were rebuilt (`state` new, empty, with the inventory of each of its nodes);
        the entries are taken again right after, each reported to `entry_changed`."""

    def entry_changed(self, ledger: Ledger, uid: str) -> None:
        """`ledger.entries[uid]` appeared, went or was replaced."""


class Ledger:
    """Derived allocation state; all methods are synchronous (called from one event loop)."""

    def __init__(self, node_objs: Iterable[Mapping[str, Any]] = ()) -> None:
        # Called with a pod UID whenever `entries[uid]` appears, goes or is replaced (derived views, e.g. the
        # queues' usage, follow the ledger incrementally); nothing else may change an entry's allocation.
        self.listeners: list[Callable[[str], None]] = []
        self.entries: dict[str, Entry] = {}
        self.stranded: dict[str, Entry] = {}  # confirmed by the API but refused by capacity or node
        self.node_objs: dict[str, Mapping[str, Any]] = {}
        # Per node, a number that changes whenever its object is replaced (every node event applied, not only
        # those that change capacity): what is derived from a node's object may be kept under it
        # (node_rules.MayRunCache). Cheaper to compare than the object's resourceVersion, and it holds for
        # objects without one. `node_serial` changes with any of them and when a node goes: while it stays,
        # no node object changed.
        self.node_versions: dict[str, int] = {}
        self.node_serial = 0
        # Nodes with PreferNoSchedule taints (usually none), kept per event so that a Score plugin need not
        # read every node per call.
        self.soft_taints: dict[str, tuple[Mapping[str, Any], ...]] = {}
        self._signatures: dict[str, tuple[Any, ...]] = {}
        # Parsed nodes by name with the signature they were parsed from: a rebuild re-reads only the
        # nodes that changed (decoding thousands of inventories took most of a rebuild's time).
        self._parsed: dict[str, tuple[tuple[Any, ...], Node | None, str | None, InventoryDoc | None]] = {}
        self.inventories: dict[str, InventoryDoc] = {}  # of the nodes in `state`, decoded once per change
        self.node_errors: dict[str, str] = {}
        self.generation = 0  # bumped whenever `state` is replaced
        self.stale = False  # node changes applied to node_objs but not yet to `state` (see apply_node)
        self.state = ClusterState([])
        self.rank = np.zeros(0, dtype=np.int64)
        # Shares per GPU, aligned with `state` ([node, GPU slot]): pods holding a share, the MPS clients
        # among them, and each node's limit (its inventory's split). `full_gpus` counts GPUs at a limit.
        self.split: IntArray = np.zeros(0, dtype=np.int64)
        self.sharers: IntArray = np.zeros((0, 1), dtype=np.int64)
        self.mps_sharers: IntArray = np.zeros((0, 1), dtype=np.int64)
        self.full_gpus = 0
        self.node_full: IntArray = np.zeros(0, dtype=np.int64)  # per node: its GPUs at a limit (either kind)
        self.views: list[LedgerView] = []
        self.claim_objs: dict[str, Mapping[str, Any]] = {}  # DRA claims by UID, counted again on node changes
        self.moves: dict[str, Move] = {}  # remote shares' moves by claim UID (gpupool.api.moves)
        self.replace_nodes(node_objs)

    def attach(self, view: LedgerView) -> None:
        """Keep `view` up to date from now on, starting from the nodes and entries as they are."""
        self.views.append(view)
        view.nodes_changed(self.state, self.inventories)
        for uid in list(self.entries):
            view.entry_changed(self, uid)

    # --- nodes ----------------------------------------------------------------------------------------

    def _note_taints(self, name: str, obj: Mapping[str, Any]) -> None:
        taints = soft_taints(obj)
        if taints:
            self.soft_taints[name] = taints
        else:
            self.soft_taints.pop(name, None)

    def _node(self, name: str, obj: Mapping[str, Any]) -> tuple[Node | None, str | None, InventoryDoc | None]:
        sig = self._signatures[name]
        cached = self._parsed.get(name)
        if cached is not None and cached[0] == sig:
            return cached[1], cached[2], cached[3]
        try:
            read, error = read_node(obj), None  # the inventory decoded once for all it gives
        except InventoryError as e:
            read, error = None, str(e)
        node, doc = (None, None) if read is None else read
        self._parsed[name] = (sig, node, error, doc)
        return node, error, doc

    def _rebuild_state(self) -> None:
        self.stale = False
        nodes: list[tuple[Node, int]] = []
        self.node_errors, self.inventories = {}, {}
        for name, obj in self.node_objs.items():
            node, error, doc = self._node(name, obj)
            if error is not None:
                self.node_errors[name] = error
            elif node is not None and doc is not None:
                nodes.append((node, doc.split))
                self.inventories[node.name] = doc
        for gone in set(self._parsed) - set(self.node_objs):
            del self._parsed[gone]
        nodes.sort(key=lambda ns: ns[0].name)
        self.state = ClusterState(n for n, _ in nodes)
        self.rank = np.arange(len(nodes), dtype=np.int64)
        self.split = np.array([s for _, s in nodes], dtype=np.int64)
        self.sharers = np.zeros((len(nodes), self.state.width), dtype=np.int64)
        self.mps_sharers = np.zeros_like(self.sharers)
        self.full_gpus = 0
        self.node_full = np.zeros(len(nodes), dtype=np.int64)
        for view in self.views:
            view.nodes_changed(self.state, self.inventories)  # the entries below are reported again
        self.generation += 1
        entries = sorted(self.entries.values(), key=lambda e: e.assumed)  # confirmed ones first
        entries += list(self.stranded.values())
        self.entries, self.stranded = {}, {}
        for e in entries:
            if e.claim:
                continue  # counted again from its object below: its GPUs' UUIDs may only be known now
            refused = self._take(e)
            if refused is not None:
                self._notify(e.uid)  # it held capacity before the change, now nothing
                if not e.assumed:
                    log.warning("pod %s no longer fits after a node change: %s", e.key, refused)
                    self.stranded[e.uid] = e
        for uid, claim in list(self.claim_objs.items()):
            self._count_claim(uid, claim)

    def apply_node(self, event_type: str, obj: Mapping[str, Any], rebuild: bool = True) -> bool:
        """Apply a node watch event; returns True when it changes the capacity view, which is rebuilt now,
        or with `rebuild` False at the next `refresh` (so that a burst of node changes, e.g. a controller
        relabelling every node, costs one rebuild instead of one per node: 0.12 s each at 5,000 nodes)."""
        name = str(obj["metadata"]["name"])
        if event_type == "DELETED":
            if name not in self.node_objs:
                return False
            del self.node_objs[name]
            self.node_versions.pop(name, None)
            self.node_serial += 1
            self._signatures.pop(name, None)
            self.soft_taints.pop(name, None)
        else:
            sig = node_signature(obj)
            self.node_objs[name] = obj
            self.node_serial += 1
            self.node_versions[name] = self.node_serial
            self._note_taints(name, obj)
            if self._signatures.get(name) == sig:
                return False
            self._signatures[name] = sig
        self.stale = True
        if rebuild:
            self.refresh()
        return True

    def refresh(self) -> bool:
        """Rebuild the capacity view if node changes are waiting for it; returns whether it did."""
        if not self.stale:
            return False
        self._rebuild_state()
        return True

    def replace_nodes(self, objs: Iterable[Mapping[str, Any]]) -> None:
        self.node_objs = {str(o["metadata"]["name"]): o for o in objs}
        self.node_versions = {name: self.node_serial + k for k, name in enumerate(self.node_objs, start=1)}
        self.node_serial += len(self.node_objs) + 1  # (+1: also when no node is left)
        self._signatures = {n: node_signature(o) for n, o in self.node_objs.items()}
        self.soft_taints = {}
        for name, obj in self.node_objs.items():
            self._note_taints(name, obj)
        self._rebuild_state()

    # --- shares per GPU -------------------------------------------------------------------------------

    def _count(self, entry: Entry, step: int) -> None:
        i = self.state.index[entry.allocation.node]
        limit = int(self.split[i])
        change = 0
        for g in entry.allocation.grants:
            before = int(self.sharers[i, g.index])
            self.sharers[i, g.index] = before + step
            change += (before + step >= limit) - (before >= limit)
            if entry.mps:
                before = int(self.mps_sharers[i, g.index])
                self.mps_sharers[i, g.index] = before + step
                change += (before + step >= MPS_CLIENTS_PER_GPU) - (before >= MPS_CLIENTS_PER_GPU)
        if change:
            self.full_gpus += change
            self.node_full[i] += change

    def full(self, nodes: IntArray, mps: bool) -> BoolArray:
        """[len(nodes), width]: GPUs of `nodes` that cannot take one more pod (an MPS client when `mps`)."""
        out: BoolArray = self.sharers[nodes] >= self.split[nodes][:, None]
        if mps:
            out |= self.mps_sharers[nodes] >= MPS_CLIENTS_PER_GPU
        return out

    def share_limit(self, node: int, mps: bool) -> int:
        limit = int(self.split[node])
        return min(limit, MPS_CLIENTS_PER_GPU) if mps else limit

    def _over_share_limit(self, entry: Entry) -> str | None:
        i = self.state.index.get(entry.allocation.node)
        if i is None:
            return None  # ClusterState.allocate refuses it with its own reason
        full = self.full(np.array([i], dtype=np.int64), entry.mps)[0]
        for g in entry.allocation.grants:
            if 0 <= g.index < len(full) and full[g.index]:
                return (f"GPU {g.index} of {entry.allocation.node} already holds "
                        f"{self.share_limit(i, entry.mps)} pods, its limit")
        return None

    # --- pods -----------------------------------------------------------------------------------------

    def _notify(self, uid: str) -> None:
        for view in self.views:
            view.entry_changed(self, uid)
        for listener in self.listeners:
            listener(uid)

    def _take(self, entry: Entry) -> str | None:
        refused = self.state.allocate(entry.request, entry.allocation)
        if refused is None:
            self.entries[entry.uid] = entry
            self._count(entry, +1)
            self._notify(entry.uid)
        return refused

    def release(self, uid: str) -> Entry | None:
        self.stranded.pop(uid, None)
        entry = self.entries.pop(uid, None)
        if entry is not None:
            self.state.release(uid)
            self._count(entry, -1)
            self._notify(uid)
        return entry

    def assume(
        self, uid: str, key: str, request: PodRequest, allocation: Allocation, deadline: float, mps: bool = False,
        claim: bool = False,
    ) -> str | None:
        """Reserve capacity for a bind in flight (or, with `claim`, for a DRA claim gpupool is allocating).
        Returns None, or why it cannot be reserved (over capacity, or a GPU already shared by as many pods
        as its node allows)."""
        if uid in self.entries:
            held = self.entries[uid].allocation.node
            return f"{'claim' if claim else 'pod'} {key} already holds an allocation on {held}"
        entry = Entry(uid, key, replace(request, key=uid), replace(allocation, pod=uid), True, deadline, mps,
                      claim=claim)
        return self._over_share_limit(entry) or self._take(entry)

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

    def apply_pod(self, event_type: str, pod: Mapping[str, Any]) -> Entry | None:
        """Follow a pod event. Returns the entry when the event confirms a pod's allocation (a newly bound
        pod, as the API shows it), else None."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        if event_type == "DELETED" or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            self.release(uid)
            return None
        counted = counted_allocation(pod)
        entry = self.entries.get(uid)
        if counted is None:
            # Not (yet) bound with an allocation. An assumed entry waits for its bind; a confirmed one
            # lost its annotation and no longer holds anything.
            if entry is not None and not entry.assumed:
                self.release(uid)
            return None
        if entry is not None and grants_signature(entry.allocation) == grants_signature(counted.allocation):
            confirmed = entry.assumed
            entry.assumed = False
            entry.containers = counted.containers
            return entry if confirmed else None
        if entry is not None or uid in self.stranded:
            self.release(uid)
        new = Entry(uid, counted.key, counted.request, counted.allocation, False, mps=counted.mps,
                    containers=counted.containers)
        refused = self._take(new)
        if refused is not None:
            log.error("pod %s is bound with an allocation that exceeds capacity: %s", counted.key, refused)
            self.stranded[uid] = new
        return new

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Resynchronise with a fresh pod list: confirmed entries are rebuilt from it; assumed entries
        survive only while their pod still exists. Claims are not pods: they stay."""
        pods = list(pods)
        alive = {str((p.get("metadata") or {}).get("uid", "")) for p in pods}
        for uid, e in list(self.entries.items()):
            if not e.claim and (not e.assumed or uid not in alive):
                self.release(uid)
        self.stranded = {u: e for u, e in self.stranded.items() if e.claim}
        for p in pods:
            self.apply_pod("ADDED", p)

    # --- DRA claims ------------------------------------------------------------------------------------

    def apply_claim(self, event_type: str, claim: Mapping[str, Any]) -> Entry | None:
        """Follow a ResourceClaim event; returns the claim's entry while it holds our devices."""
        uid = str((claim.get("metadata") or {}).get("uid", ""))
        if event_type == "DELETED":
            self.claim_objs.pop(uid, None)
            self._count_claim(uid, None)
            return None
        self.claim_objs[uid] = claim
        return self._count_claim(uid, claim)

    def _count_claim(self, uid: str, claim: Mapping[str, Any] | None) -> Entry | None:
        """Count the claim on the GPUs it holds: one entry under its UID, and while its remote share moves
        (gpupool.api.moves, `ready`) a second one under `uid + MOVING_SUFFIX` on the move's target."""
        counted = () if claim is None else counted_claim(claim, self.state, self.moves.get(uid))
        if claim is not None and not counted:  # deallocated, or holding none of our devices
            self.claim_objs.pop(uid, None)
        wanted = {c.uid: c for c in counted}
        keys = (uid, uid + MOVING_SUFFIX)
        # What goes or changes is given back before anything is taken: when a move finishes, the claim's
        # entry takes over the target's capacity from the entry that held it while the share travelled.
        for key in keys:
            entry, now = self.entries.get(key), wanted.get(key)
            # A share gpupool assumed while it writes the allocation is not given back by an event that shows
            # the claim unallocated: events queued before the write (the claim's creation, its finalizer)
            # arrive after the assume, and giving the share back let the next claim take it too. It goes by
            # forget (the write failed), expiry, or the claim's deletion (claim None).
            gone = entry is not None and entry.claim and now is None and not (entry.assumed and claim is not None)
            changed = entry is not None and now is not None and \
                grants_signature(entry.allocation) != grants_signature(now.allocation)
            if gone or changed or key in self.stranded:
                self.release(key)
        for key in keys:
            now = wanted.get(key)
            if now is None:
                continue
            entry = self.entries.get(key)
            if entry is not None:  # unchanged (or assumed by gpupool's allocator): the API confirms it
                entry.assumed = False
                continue
            new = Entry(key, now.key, now.request, now.allocation, False, mps=now.mps, containers=now.containers,
                        claim=True)
            refused = self._take(new)
            if refused is not None:
                log.error("claim %s is allocated beyond what gpupool counts free: %s", now.key, refused)
                self.stranded[key] = new
        return self.entries.get(uid) or self.stranded.get(uid)

    def replace_moves(self, moves: Mapping[str, Move]) -> None:
        """Follow the remote shares' moves (claim UID -> its entry of gpupool.api.moves): the claims whose
        entry appeared, changed or went are counted again where they are held now."""
        before, self.moves = self.moves, dict(moves)
        for uid in set(before) | set(self.moves):
            if before.get(uid) != self.moves.get(uid) and uid in self.claim_objs:
                self._count_claim(uid, self.claim_objs[uid])

    def replace_claims(self, claims: Iterable[Mapping[str, Any]]) -> None:
        """Resynchronise with a fresh list of ResourceClaims (an assumed share of a listed claim stays, as in
        _count_claim: the list can predate gpupool's write)."""
        claims = list(claims)
        listed = {str((c.get("metadata") or {}).get("uid", "")) for c in claims}
        for uid, e in list(self.entries.items()):
            if e.claim and not (e.assumed and uid in listed):
                self.release(uid)
        self.stranded = {u: e for u, e in self.stranded.items() if not e.claim}
        self.claim_objs = {}
        for c in claims:
            self.apply_claim("ADDED", c)

    # --- victims (gpupool.scheduler.framework.preemption) -----------------------------------------------

    def claim_users(self, uid: str) -> tuple[str, ...]:
        """The UIDs of the pods that use the claim counted under `uid` (sorted), as its object says: the pods
        it is reserved for (`status.reservedFor`, which kube-scheduler writes when it binds a claim's pod) and
        the pod that owns it (a claim made from the pod's template, reserved or not yet). Evicting all of them
        frees the share; none for an entry that is not a claim (or a moving share's second entry)."""
        claim = self.claim_objs.get(uid)
        if claim is None:
            return ()
        users = {str(r.get("uid")) for r in (claim.get("status") or {}).get("reservedFor") or []
                 if r.get("resource") == "pods" and r.get("uid")}
        users |= {str(o.get("uid")) for o in (claim.get("metadata") or {}).get("ownerReferences") or []
                  if o.get("kind") == "Pod" and o.get("uid")}
        return tuple(sorted(users))

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
                missing.append(f"{c.key} ({uid}) holds {fmt_allocation(c.allocation)} in the API but not in the ledger")
            elif grants_signature(e.allocation) != grants_signature(c.allocation):
                different.append(
                    f"{c.key}: ledger {fmt_allocation(e.allocation)} != API {fmt_allocation(c.allocation)}")
        for uid, e in self.entries.items():
            if uid not in truth.allocations and not e.assumed:
                extra.append(f"{e.key} ({uid}) holds {fmt_allocation(e.allocation)} in the ledger but not in the API")
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
                "kind": "claim" if e.claim else "pod",
                "uid": e.uid,
                "node": e.allocation.node,
                "state": "assumed" if e.assumed else "confirmed",
                "policy": e.allocation.policy,
                "gpus": [
                    {"uuid": g.uuid, "index": g.index, "cores": g.milli / 10, "memory_mib": g.memory_mib,
                     **({"mig": {"profile": g.mig.profile, "start": g.mig.start}} if g.mig else {})}
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
