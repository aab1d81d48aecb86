"""The allocation ledger: which pod holds which GPU share, derived from API objects.

Truth lives in the API server: a pod *counts* when it is bound (spec.nodeName), not terminal, and carries
a `gpupool.io/allocation` annotation written for its own UID and node. The ledger mirrors exactly that
(`confirmed` entries) plus *assumed* entries for binds in flight. Assumed entries are confirmed when the
watch shows the pod bound with the same allocation, and forgotten when the bind fails or their deadline
passes. Capacity is consumed through `ClusterState.allocate`, which refuses anything over capacity.

Shares per GPU: the ledger also counts, per GPU, the pods holding a share of it (and how many of them are
MPS clients), with each node's limit from its inventory (`split`, the device-plugin slots per GPU) and
MPS_CLIENTS_PER_GPU for MPS. Core has no such count; the scheduler keeps it here, incrementally, and the
`shares_per_gpu` plugin hides full GPUs from a pod. `assume` refuses a grant on a full GPU (what the API
confirms is counted regardless: it is the truth, and the diff reports it).

`recompute` rebuilds the same view from API objects alone; `diff` compares the two (the invariant
checker behind the debug endpoint and the tests). The recomputation also checks every allocation against
its pod's own spec (a grant larger or smaller than the pod asks is reported) and every GPU against its
share limit, so state forged through the API shows in the diff.

MIG: the ledger also keeps the nodes' MIG-mode GPUs (`mig`, gpupool.scheduler.mig_layouts) with the MIG
instances its entries' grants name laid over the agents' reports, and `mig_gpu` marks those GPUs in the
capacity view: they serve pods with isolation `mig` only, one instance per grant.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gpupool.api.allocation import AllocationError, decode_allocation
from gpupool.api.inventory import InventoryError, decode_inventory, node_from_object, read_node
from gpupool.api.names import ANN_ALLOCATION, ANN_INVENTORY
from gpupool.api.pod import parse_pod, pod_key
from gpupool.api.preferences import soft_taints
from gpupool.api.squeeze import is_squeezed
from gpupool.core.mig import mig_model
from gpupool.core.mig_placement import MigGPU
from gpupool.core.mig_request import ProfileRefusal, grant_share, profile_for
from gpupool.core.model import MILLI_PER_GPU, Allocation, GPUGrant, Node, PodRequest
from gpupool.core.state import BoolArray, ClusterState, IntArray
from gpupool.scheduler.mig_layouts import MigLayouts, mig_gpus

log = logging.getLogger(__name__)

TERMINAL_PHASES = ("Succeeded", "Failed")
# An MPS control daemon serves at most 48 client processes per GPU (Volta and newer); gpupool counts one
# client per pod (a pod with several CUDA processes needs more, which this limit cannot see).
MPS_CLIENTS_PER_GPU = 48
DEFAULT_SPLIT = 10  # an inventory without `split` (the field's default in gpupool.api.inventory)


@dataclass(slots=True)
class Entry:
    uid: str
    key: str  # namespace/name, for people
    request: PodRequest  # key = uid inside the ClusterState
    allocation: Allocation  # pod = uid
    assumed: bool
    deadline: float = 0.0  # assumed entries are forgotten after this time
    mps: bool = False  # an MPS client on its GPUs (isolation "mps")


@dataclass(frozen=True, slots=True)
class Counted:
    """A pod that holds capacity according to the API objects."""

    uid: str
    key: str
    request: PodRequest
    allocation: Allocation
    mps: bool = False
    spec_errors: tuple[str, ...] = ()  # the pod's own spec could not be read (it asks for nothing valid)
    squeezed: bool = False  # a reclaim lowered its compute (gpupool.api.squeeze): less than its spec is right


def grants_signature(a: Allocation) -> tuple[str, tuple[tuple[str, int, int, int, str, int], ...]]:
    return a.node, tuple(sorted((g.uuid, g.index, g.milli, g.memory_mib,
                                 *((g.mig.profile, g.mig.start) if g.mig else ("", -1))) for g in a.grants))


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
    return Counted(uid, pod_key(pod), replace(request, key=uid), doc.allocation(uid), parsed.isolation == "mps",
                   tuple(parsed.errors), is_squeezed(pod))


def beyond_spec(c: Counted, node: Node) -> str | None:
    """Why the allocation is not what the pod's own spec asks on this node (None: it is exactly that).
    The scheduler grants `count` GPUs of `milli` compute and `memory_on(card)` memory each
    (ClusterState.grants_for); anything else was not decided from the pod."""
    if c.spec_errors:
        return f"{c.key}: holds {_fmt(c.allocation)} but its spec asks for no valid share ({'; '.join(c.spec_errors)})"
    g = c.request.gpu
    if len(c.allocation.grants) != g.count:
        return f"{c.key}: holds {len(c.allocation.grants)} GPU(s) ({_fmt(c.allocation)}), its spec asks for {g.count}"
    cards = {gpu.index: gpu for gpu in node.gpus}
    for grant in c.allocation.grants:
        card = cards.get(grant.index)
        if card is None:
            continue  # a grant for a GPU the node does not have: ClusterState.allocate reports it
        if grant.mig is not None:
            unasked = _beyond_mig(c, grant, card.model, node.name)
            if unasked is not None:
                return unasked
            continue
        milli, memory = min(g.milli, MILLI_PER_GPU), g.memory_on(card.memory_mib)
        if (grant.milli != milli and not (c.squeezed and 0 < grant.milli < milli)) or grant.memory_mib != memory:
            return (f"{c.key}: holds {grant.milli / 10:g} percent / {grant.memory_mib} MiB on GPU {grant.index} of "
                    f"{node.name}, its spec asks for {milli / 10:g} percent / {memory} MiB")
    return None


def _beyond_mig(c: Counted, grant: GPUGrant, model_name: str, node: str) -> str | None:
    """A MIG grant records its profile's share (gpupool.core.mig_request.grant_share), and the profile
    must hold what the pod's spec asks (a named profile may be larger than the request)."""
    assert grant.mig is not None
    model = mig_model(model_name)
    profile = model.profile(grant.mig.profile) if model is not None else None
    where = f"GPU {grant.index} of {node}"
    if model is None or profile is None:
        return f"{c.key}: holds MIG {grant.mig.profile} on {where}, a {model_name} has no such profile"
    milli, memory = grant_share(model, profile)
    if (grant.milli, grant.memory_mib) != (milli, memory):
        return (f"{c.key}: holds {grant.milli / 10:g} percent / {grant.memory_mib} MiB on {where}, its MIG "
                f"profile {profile.name} gives {milli / 10:g} percent / {memory} MiB")
    held = profile_for(model, c.request.gpu, profile.name)
    if isinstance(held, ProfileRefusal):
        return f"{c.key}: holds MIG {profile.name} on {where}, which does not hold its spec: {held.reason}"
    return None


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
    """What of a Node object the ledger depends on (an annotation it does not read must not rebuild anything)."""
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
    node_objs = list(node_objs)
    nodes, _ = nodes_from_objects(node_objs)
    splits = {str((o.get("metadata") or {}).get("name", "")): inventory_split(o) for o in node_objs}
    state = ClusterState(nodes)
    out = Recomputed()
    pods_on: dict[str, list[str]] = {}  # GPU uuid -> pods holding a share of it
    mps_on: dict[str, list[str]] = {}
    for pod in pod_objs:
        c = counted_allocation(pod)
        if c is None:
            continue
        out.allocations[c.uid] = c
        i = state.index.get(c.allocation.node)
        unasked = beyond_spec(c, state.nodes[i]) if i is not None else None
        refused = state.allocate(c.request, c.allocation)
        if refused is not None:
            out.overcommitted[c.uid] = f"{c.key}: {refused}"
        elif unasked is not None:
            out.overcommitted[c.uid] = unasked
        for g in c.allocation.grants:
            pods_on.setdefault(g.uuid, []).append(c.key)
            if c.mps:
                mps_on.setdefault(g.uuid, []).append(c.key)
    for n in nodes:
        split = splits.get(n.name, DEFAULT_SPLIT)
        for gpu in n.gpus:
            held, clients = pods_on.get(gpu.uuid, []), mps_on.get(gpu.uuid, [])
            if len(held) > split:
                out.overcommitted[f"{gpu.uuid}/split"] = (
                    f"GPU {gpu.index} of {n.name} is shared by {len(held)} pods, over its limit of {split} (split)")
            if len(clients) > MPS_CLIENTS_PER_GPU:
                out.overcommitted[f"{gpu.uuid}/mps"] = (
                    f"GPU {gpu.index} of {n.name} serves {len(clients)} MPS clients, over the limit of "
                    f"{MPS_CLIENTS_PER_GPU}")
    return out


def inventory_split(obj: Mapping[str, Any]) -> int:
    """The node's pods-per-GPU limit: its inventory's `split` (DEFAULT_SPLIT when unreadable)."""
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANN_INVENTORY)
    if not text:
        return DEFAULT_SPLIT
    try:
        return decode_inventory(str(text)).split
    except InventoryError:
        return DEFAULT_SPLIT


class Ledger:
    """Derived allocation state; all methods are synchronous (called from one event loop)."""

    def __init__(self, node_objs: Iterable[Mapping[str, Any]] = ()) -> None:
        # Called with a pod UID whenever `entries[uid]` appears, goes or is replaced (derived views, e.g. the
        # queues' usage, follow the ledger incrementally); nothing else may change an entry's allocation.
        self.listeners: list[Callable[[str], None]] = []
        self.entries: dict[str, Entry] = {}
        self.stranded: dict[str, Entry] = {}  # confirmed by the API but refused by capacity or node
        self.node_objs: dict[str, Mapping[str, Any]] = {}
        # Nodes with PreferNoSchedule taints (usually none), kept per event so that a Score plugin need not
        # read every node per call.
        self.soft_taints: dict[str, tuple[Mapping[str, Any], ...]] = {}
        self._signatures: dict[str, tuple[Any, ...]] = {}
        # Parsed nodes by name with the signature they were parsed from: a rebuild re-reads only the
        # nodes that changed (decoding thousands of inventories took most of a rebuild's time).
        self._parsed: dict[str, tuple[tuple[Any, ...], Node | None, str | None, int, dict[str, MigGPU],
                                      dict[str, str]]] = {}
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
        self.mig = MigLayouts()
        # Node name -> GPU UUID -> its MPS daemon's state as the inventory reports it ("", "up", "down").
        self.mps_states: dict[str, dict[str, str]] = {}
        self.mig_gpu: BoolArray = np.zeros((0, 1), dtype=bool)  # [node, GPU slot]: in MIG mode
        self.mig_node: BoolArray = np.zeros(0, dtype=bool)  # per node: has a GPU in MIG mode
        self.replace_nodes(node_objs)

    # --- nodes ----------------------------------------------------------------------------------------

    def _note_taints(self, name: str, obj: Mapping[str, Any]) -> None:
        taints = soft_taints(obj)
        if taints:
            self.soft_taints[name] = taints
        else:
            self.soft_taints.pop(name, None)

    def _node(self, name: str, obj: Mapping[str, Any]
              ) -> tuple[Node | None, str | None, int, dict[str, MigGPU], dict[str, str]]:
        sig = self._signatures[name]
        cached = self._parsed.get(name)
        if cached is not None and cached[0] == sig:
            return cached[1], cached[2], cached[3], cached[4], cached[5]
        try:
            read, error = read_node(obj), None  # the inventory decoded once for all it gives
        except InventoryError as e:
            read, error = None, str(e)
        node, split, mig, mps = (None, DEFAULT_SPLIT, {}, {}) if read is None else (
            read[0], read[1].split, mig_gpus(read[1]), {g.uuid: str(g.mps) for g in read[1].gpus})
        self._parsed[name] = (sig, node, error, split, mig, mps)
        return node, error, split, mig, mps

    def _rebuild_state(self) -> None:
        self.stale = False
        nodes: list[tuple[Node, int]] = []
        migs: list[tuple[str, dict[str, MigGPU]]] = []
        self.node_errors, self.mps_states = {}, {}
        for name, obj in self.node_objs.items():
            node, error, split, mig, mps = self._node(name, obj)
            if error is not None:
                self.node_errors[name] = error
            elif node is not None:
                nodes.append((node, split))
                migs.append((node.name, mig))
                self.mps_states[node.name] = mps
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
        self.mig.replace_nodes(migs)
        self.mig.clear_claims()  # the entries below claim their instances again
        self.mig_gpu = np.zeros((len(nodes), self.state.width), dtype=bool)
        for name, gpus in self.mig.nodes.items():
            i = self.state.index[name]
            for j, gpu in enumerate(self.state.nodes[i].gpus):
                self.mig_gpu[i, j] = gpu.uuid in gpus
        self.mig_node = np.asarray(self.mig_gpu.any(axis=1), dtype=bool)
        self.generation += 1
        entries = sorted(self.entries.values(), key=lambda e: e.assumed)  # confirmed ones first
        entries += list(self.stranded.values())
        self.entries, self.stranded = {}, {}
        for e in entries:
            refused = self._take(e)
            if refused is not None:
                self._notify(e.uid)  # it held capacity before the change, now nothing
                if not e.assumed:
                    log.warning("pod %s no longer fits after a node change: %s", e.key, refused)
                    self.stranded[e.uid] = e

    def apply_node(self, event_type: str, obj: Mapping[str, Any], rebuild: bool = True) -> bool:
        """Apply a node watch event; returns True when it changes the capacity view, which is rebuilt now,
        or with `rebuild` False at the next `refresh` (so that a burst of node changes, e.g. a controller
        relabelling every node, costs one rebuild instead of one per node: 0.12 s each at 5,000 nodes)."""
        name = str(obj["metadata"]["name"])
        if event_type == "DELETED":
            if name not in self.node_objs:
                return False
            del self.node_objs[name]
            self._signatures.pop(name, None)
            self.soft_taints.pop(name, None)
        else:
            sig = node_signature(obj)
            self.node_objs[name] = obj
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
        for listener in self.listeners:
            listener(uid)

    def _take(self, entry: Entry) -> str | None:
        refused = self.state.allocate(entry.request, entry.allocation)
        if refused is None:
            self.entries[entry.uid] = entry
            self._count(entry, +1)
            self.mig.claim(entry.uid, entry.allocation.node, entry.allocation.grants)
            self._notify(entry.uid)
        return refused

    def release(self, uid: str) -> Entry | None:
        self.stranded.pop(uid, None)
        entry = self.entries.pop(uid, None)
        if entry is not None:
            self.state.release(uid)
            self._count(entry, -1)
            self.mig.unclaim(uid)
            self._notify(uid)
        return entry

    def assume(
        self, uid: str, key: str, request: PodRequest, allocation: Allocation, deadline: float, mps: bool = False
    ) -> str | None:
        """Reserve capacity for a bind in flight. Returns None, or why it cannot be reserved (over capacity,
        or a GPU already shared by as many pods as its node allows)."""
        if uid in self.entries:
            return f"pod {key} already holds an allocation on {self.entries[uid].allocation.node}"
        entry = Entry(uid, key, replace(request, key=uid), replace(allocation, pod=uid), True, deadline, mps)
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
            return entry if confirmed else None
        if entry is not None or uid in self.stranded:
            self.release(uid)
        new = Entry(uid, counted.key, counted.request, counted.allocation, False, mps=counted.mps)
        refused = self._take(new)
        if refused is not None:
            log.error("pod %s is bound with an allocation that exceeds capacity: %s", counted.key, refused)
            self.stranded[uid] = new
        return new

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


def _fmt(a: Allocation) -> str:
    gpus = ",".join(f"{g.index}:{g.milli / 10:g}%/{g.memory_mib}Mi" for g in a.grants)
    return f"{a.node}[{gpus}]"
