"""The embedded cluster: an in-process stand-in for the Kubernetes API server.

It keeps objects of any kind (core kinds, leases, custom resources once their CustomResourceDefinition
exists, resource.k8s.io) as Kubernetes-shaped dicts and reproduces the behaviour the scheduler
relies on: one global resourceVersion bumped on every write, Conflict on stale preconditions, a Binding
that sets spec.nodeName exactly once, graceful deletion with finalizers, and watch streams that can
resume from a resourceVersion (Gone when it fell out of the history). No I/O, no threads: it lives on
the event loop of its user.
"""

from __future__ import annotations

import asyncio
import marshal
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpupool.cluster.port import (
    CRDS,
    LEASES,
    PDBS,
    PODS,
    AlreadyExists,
    ClusterPort,
    Conflict,
    Gone,
    Invalid,
    Kind,
    NotFound,
    Obj,
    Selector,
    TooManyRequests,
    WatchEvent,
    field_labels,
)

_HISTORY = 50_000  # watch events kept per kind so that watchers can resume after a short gap
_CLOSED = object()


def copy_obj(value: Any) -> Any:
    """Deep copy of JSON-shaped data. marshal round-trips dict/list/str/int/float/bool/None in C, several
    times faster than copy.deepcopy or a recursive copy; anything else raises ValueError."""
    return marshal.loads(marshal.dumps(value))


def _copy(obj: Obj) -> Obj:
    copied: Obj = copy_obj(obj)
    return copied


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _check_string_maps(meta: Obj, kind: Kind) -> None:
    for field in ("labels", "annotations"):
        for key, value in (meta.get(field) or {}).items():
            if not isinstance(value, str):
                raise Invalid(f"{kind.kind.lower()} {meta.get('name')}: {field[:-1]} {key}: value must be a string, "
                              f"got {type(value).__name__}")


_Key = tuple[str, str]  # (namespace or "", name)
_Match = Callable[[Obj], bool]
# Groups the API server serves without a CustomResourceDefinition.
_BUILT_IN_GROUPS = {"", "apps", "batch", "policy", "autoscaling"}
_INDEXED = {("v1", "Pod"): "spec.nodeName"}
# Built-in kinds whose status is a subresource: a patch of the main resource leaves status alone.
_STATUS_SUBRESOURCE = {("v1", "Pod"), ("v1", "Node"), ("v1", "Namespace"), ("resource.k8s.io/v1", "ResourceClaim")}


class _Kind:
    """Objects of one kind plus the event history and live watchers."""

    def __init__(self, kind: Kind) -> None:
        self.kind = kind
        self.objects: dict[_Key, Obj] = {}
        # (resourceVersion, event, the object as the previous event showed it) for selector watches
        self.history: deque[tuple[int, WatchEvent, Obj | None]] = deque(maxlen=_HISTORY)
        self.dropped_before = 0  # resourceVersions at or below this may be missing from history
        self.last: dict[_Key, Obj] = {}  # each object as its latest event carries it (shared, read-only)
        self.watchers: set[asyncio.Queue[Any]] = set()
        # The field the API server's watch cache indexes for this kind (pods: spec.nodeName), so a node's
        # pods are found without a scan: value -> keys, and each key's current value.
        self.indexed = _INDEXED.get((kind.api_version, kind.kind))
        self.index: dict[str, set[_Key]] = {}
        self.index_of: dict[_Key, str] = {}

    def reindex(self, key: _Key, obj: Obj | None) -> None:
        if self.indexed is None:
            return
        before = self.index_of.pop(key, None)
        if before is not None:
            self.index[before].discard(key)
        if obj is not None:
            value = field_value(obj, self.indexed)
            self.index_of[key] = value
            self.index.setdefault(value, set()).add(key)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, None removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy_obj(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def field_value(obj: Obj, path: str) -> str:
    """A field as the API server compares it in a field selector: missing is "", booleans are lower-case."""
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def selector_match(
    kind: Kind, namespace: str | None, labels: Selector | None, fields: Selector | None
) -> _Match | None:
    """A predicate for the objects a list or watch selects, or None when it selects every object.
    Raises Invalid for a field the API server does not index for this kind."""
    unsupported = sorted(set(fields or ()) - field_labels(kind))
    if unsupported:
        raise Invalid(f"{kind}: field label not supported: {', '.join(unsupported)}")
    if namespace is None and not labels and not fields:
        return None
    wanted_labels = list((labels or {}).items())
    wanted_fields = list((fields or {}).items())

    def match(obj: Obj) -> bool:
        meta = obj.get("metadata") or {}
        if namespace is not None and meta.get("namespace", "") != namespace:
            return False
        if wanted_labels:
            have = meta.get("labels") or {}
            for k, v in wanted_labels:
                if have.get(k) != v:
                    return False
        return all(field_value(obj, path) == v for path, v in wanted_fields)

    return match


def _through(match: _Match | None, event: WatchEvent, before: Obj | None) -> WatchEvent | None:
    """What a watcher with this selector sees of `event` (the API server's watch-cache rule)."""
    if match is None:
        return event
    now = match(event.object)
    was = before is not None and match(before)
    if event.type == "DELETED":
        return event if was or now else None
    if now and was:
        return event
    if now:
        return WatchEvent("ADDED", event.object)
    if was:  # as the API server's watch cache: the last state that matched
        return WatchEvent("DELETED", before) if before is not None else event
    return None


class MemoryCluster(ClusterPort):
    """Implements `gpupool.cluster.port.ClusterPort` in memory."""

    def __init__(self, clock: Callable[[], float] = time.time, latency_s: float = 0.0) -> None:
        self._clock = clock
        # Every call suspends (for `latency_s`, or just one loop turn) like a network round trip would, so
        # concurrent callers interleave between their reads and writes as they do against a real server.
        self._latency_s = latency_s
        self._rv = 0
        self._kinds: dict[tuple[str, str], _Kind] = {}
        self.events: deque[Obj] = deque(maxlen=10_000)  # Kubernetes Events, newest last
        self.bindings = 0  # number of successful Bindings (tests count them)

    async def _io(self) -> None:
        await asyncio.sleep(self._latency_s)

    # --- internals -------------------------------------------------------------------------------------

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _kind(self, kind: Kind) -> _Kind:
        """The store of `kind`; NotFound for a custom resource without its CustomResourceDefinition."""
        k = self._kinds.get((kind.api_version, kind.kind))
        if k is not None:
            return k
        if not self._served(kind):
            raise NotFound(f"the server could not find the requested resource ({kind}): no CustomResourceDefinition "
                           f"{kind.plural}.{kind.group} serves version {kind.version}")
        k = self._kinds[(kind.api_version, kind.kind)] = _Kind(kind)
        return k

    def _served(self, kind: Kind) -> bool:
        if kind.group in _BUILT_IN_GROUPS or kind.group.endswith(".k8s.io"):
            return True
        crd = self._crd(kind)
        versions = ((crd or {}).get("spec") or {}).get("versions") or []
        return crd is not None and any(v.get("name") == kind.version and v.get("served", True) for v in versions)

    def _crd(self, kind: Kind) -> Obj | None:
        crds = self._kinds.get((CRDS.api_version, CRDS.kind))
        return None if crds is None else crds.objects.get(("", f"{kind.plural}.{kind.group}"))

    def _has_status_subresource(self, kind: Kind) -> bool:
        if (kind.api_version, kind.kind) in _STATUS_SUBRESOURCE:
            return True
        crd = self._crd(kind)
        versions = ((crd or {}).get("spec") or {}).get("versions") or []
        return any(v.get("name") == kind.version and "status" in (v.get("subresources") or {}) for v in versions)

    def _emit(self, kind: _Kind, type_: str, obj: Obj) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        event = WatchEvent(type_, copy_obj(obj))
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        before = kind.last.pop(key, None) if type_ == "DELETED" else kind.last.get(key)
        if type_ != "DELETED":
            kind.last[key] = event.object
        if len(kind.history) == kind.history.maxlen:
            kind.dropped_before = kind.history[0][0]
        kind.history.append((rv, event, before))
        for q in kind.watchers:
            q.put_nowait((event, before))

    @staticmethod
    def _key(kind: Kind, namespace: str | None, name: str) -> _Key:
        return ((namespace or "default") if kind.namespaced else "", name)

    def _get(self, kind: Kind, namespace: str | None, name: str) -> Obj:
        key = self._key(kind, namespace, name)
        obj = self._kind(kind).objects.get(key)
        if obj is None:
            where = f"{key[0]}/{name}" if key[0] else name
            raise NotFound(f"{kind.kind.lower()} {where} not found")
        return obj

    def _check_rv(self, obj: Obj, resource_version: str | None, what: str) -> None:
        current = obj["metadata"]["resourceVersion"]
        if resource_version is not None and resource_version != current:
            raise Conflict(
                f"{what}: the object has been modified (resourceVersion {resource_version} != {current}); "
                "read it again and retry"
            )

    def _write(self, kind: Kind, obj: Obj, type_: str) -> Obj:
        obj["metadata"]["resourceVersion"] = self._next_rv()
        k = self._kind(kind)
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        k.objects[key] = obj
        k.reindex(key, obj)
        self._emit(k, type_, obj)
        return _copy(obj)

    def _create(self, kind: Kind, obj: Obj, dry_run: bool = False) -> Obj:
        store = self._kind(kind)
        obj = copy_obj(obj)
        meta = obj.setdefault("metadata", {})
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise Invalid(f"{kind.kind.lower()}: metadata.name is required")
        if kind.namespaced:
            meta["namespace"] = meta.get("namespace") or "default"
        else:
            meta.pop("namespace", None)
        _check_string_maps(meta, kind)
        key = (meta.get("namespace", ""), name)
        if key in store.objects:
            raise AlreadyExists(f"{kind.kind.lower()} {name} already exists")
        if kind == PODS:
            obj.setdefault("status", {}).setdefault("phase", "Pending")  # the API server's default
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339(self._clock())
        meta.pop("resourceVersion", None)
        obj["apiVersion"] = kind.api_version
        obj["kind"] = kind.kind
        if dry_run:  # checked like a real create, stored nowhere (no resourceVersion, no watch event)
            return obj
        return self._write(kind, obj, "ADDED")

    def _list(
        self, kind: Kind, namespace: str | None = None, labels: Selector | None = None, fields: Selector | None = None
    ) -> tuple[list[Obj], str]:
        match = selector_match(kind, namespace if kind.namespaced else None, labels, fields)
        store = self._kind(kind)
        objects: Iterable[Obj] = store.objects.values()
        if store.indexed is not None and fields and store.indexed in fields:
            objects = [store.objects[key] for key in store.index.get(fields[store.indexed], ())]
        return [copy_obj(o) for o in objects if match is None or match(o)], str(self._rv)

    async def _watch(
        self, kind_: Kind, resource_version: str, namespace: str | None = None, labels: Selector | None = None,
        fields: Selector | None = None,
    ) -> AsyncIterator[WatchEvent]:
        await self._io()
        match = selector_match(kind_, namespace if kind_.namespaced else None, labels, fields)
        kind = self._kind(kind_)
        start = int(resource_version or 0)
        if start < kind.dropped_before:
            raise Gone(f"watch {kind_} from resourceVersion {start}: too old, list again")
        queue: asyncio.Queue[Any] = asyncio.Queue()
        # Replay and registration happen without an await in between, so no event is lost or doubled.
        backlog = [(e, before) for rv, e, before in kind.history if rv > start]
        kind.watchers.add(queue)
        try:
            for event, before in backlog:
                seen = _through(match, event, before)
                if seen is not None:
                    yield seen
            while True:
                item = await queue.get()
                if item is _CLOSED:
                    return
                seen = _through(match, *item)
                if seen is not None:
                    yield seen
        finally:
            kind.watchers.discard(queue)

    def _remove(self, kind_: Kind, obj: Obj) -> None:
        kind = self._kind(kind_)
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        del kind.objects[key]
        kind.reindex(key, None)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._emit(kind, "DELETED", obj)

    def _patch(
        self, kind: Kind, name: str, patch: Mapping[str, Any], namespace: str | None, resource_version: str | None,
        subresource: str | None,
    ) -> Obj:
        current = self._get(kind, namespace, name)
        where = f"{kind.kind.lower()} {current['metadata'].get('namespace', '')}/{name}".replace(" /", " ")
        precondition = ((patch.get("metadata") or {}).get("resourceVersion")) or resource_version
        self._check_rv(current, precondition, where)
        if subresource not in (None, "status"):
            raise NotFound(f"{where}: no subresource {subresource!r} in the embedded cluster")
        if subresource == "status":
            patch = {"status": patch.get("status") or {}}
        elif self._has_status_subresource(kind):
            patch = {k: v for k, v in patch.items() if k != "status"}
        merged = merge_patch(current, patch)
        meta = merged.setdefault("metadata", {})
        for fixed in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp"):
            if fixed in current["metadata"]:
                meta[fixed] = current["metadata"][fixed]
            else:
                meta.pop(fixed, None)
        merged["apiVersion"], merged["kind"] = current["apiVersion"], current["kind"]
        _check_string_maps(meta, kind)
        current.clear()
        current.update(merged)
        if "deletionTimestamp" in meta and not meta.get("finalizers"):  # the last finalizer went: delete
            self._remove(kind, current)
            return _copy(current)
        return self._write(kind, current, "MODIFIED")

    # --- ClusterPort: any kind --------------------------------------------------------------------------

    async def get_object(self, kind: Kind, name: str, namespace: str | None = None) -> Obj:
        await self._io()
        return _copy(self._get(kind, namespace, name))

    async def list_objects(
        self, kind: Kind, *, namespace: str | None = None, labels: Selector | None = None,
        fields: Selector | None = None,
    ) -> tuple[list[Obj], str]:
        await self._io()
        return self._list(kind, namespace, labels, fields)

    def watch_objects(
        self, kind: Kind, resource_version: str, *, namespace: str | None = None, labels: Selector | None = None,
        fields: Selector | None = None,
    ) -> AsyncIterator[WatchEvent]:
        return self._watch(kind, resource_version, namespace, labels, fields)

    async def create_object(self, kind: Kind, obj: Obj, *, dry_run: bool = False) -> Obj:
        await self._io()
        return self._create(kind, obj, dry_run)

    async def patch_object(
        self, kind: Kind, name: str, patch: Mapping[str, Any], *, namespace: str | None = None,
        resource_version: str | None = None, subresource: str | None = None,
    ) -> Obj:
        await self._io()
        return self._patch(kind, name, patch, namespace, resource_version, subresource)

    async def delete_object(
        self, kind: Kind, name: str, *, namespace: str | None = None, uid: str | None = None
    ) -> None:
        await self._io()
        obj = self._get(kind, namespace, name)
        meta = obj["metadata"]
        if uid is not None and meta["uid"] != uid:
            where = f"{meta.get('namespace', '')}/{name}".lstrip("/")
            raise Conflict(f"{kind.kind.lower()} {where}: UID precondition failed ({uid} is not the current object)")
        if meta.get("finalizers"):
            if "deletionTimestamp" not in meta:
                meta["deletionTimestamp"] = rfc3339(self._clock())
                self._write(kind, obj, "MODIFIED")
            return
        self._remove(kind, obj)

    # --- ClusterPort: what the port leaves to each adapter (the Node/Pod/Lease shortcuts are its own) -----

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        await self._io()
        pod = self._get(PODS, namespace, name)
        if pod["metadata"]["uid"] != uid:  # checked before a budget is charged, as the API server does
            raise Conflict(f"pod {namespace}/{name}: UID precondition failed ({uid} is not the current object)")
        labels = pod["metadata"].get("labels") or {}
        status = pod.get("status") or {}
        if status.get("phase") in ("Pending", "Succeeded", "Failed"):
            labels = {}  # as the API server: budgets protect running pods only
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        # The disruption controller keeps a budget's status; the embedded cluster has none, so it trusts what
        # the status says (tests set it) and charges this eviction to it, with the API server's rules.
        for pdb in self._list(PDBS, namespace)[0]:
            wanted = ((pdb.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            if not labels or not wanted or any(labels.get(k) != v for k, v in wanted.items()):
                continue
            budget = pdb.get("status") or {}
            healthy, desired = int(budget.get("currentHealthy", 0)), int(budget.get("desiredHealthy", 0))
            if not ready and healthy >= desired > 0:
                break  # a pod that is not ready counts for nothing: taking it costs the budget nothing
            allowed = int(budget.get("disruptionsAllowed", 0))
            if allowed <= 0:
                raise TooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.")
            self._patch(PDBS, pdb["metadata"]["name"], {"status": {"disruptionsAllowed": allowed - 1}},
                        namespace, None, "status")
        await self.delete_object(PODS, name, namespace=namespace, uid=uid)

    async def remove_finalizers(self, namespace: str, name: str) -> None:
        """Memory-only helper: what a controller does when it is done; finishes a pending deletion."""
        await self.patch_object(PODS, name, {"metadata": {"finalizers": None}}, namespace=namespace)

    async def create_binding(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        await self._io()
        pod = self._get(PODS, namespace, name)
        if pod["metadata"]["uid"] != uid:
            raise Conflict(f"pod {namespace}/{name}: UID precondition failed (binding is for {uid})")
        bound = pod.get("spec", {}).get("nodeName")
        if bound:
            raise Conflict(f"pod {namespace}/{name} is already assigned to node {bound!r}")
        if "deletionTimestamp" in pod["metadata"]:
            raise Conflict(f"pod {namespace}/{name} is being deleted")
        pod.setdefault("spec", {})["nodeName"] = node
        if annotations:
            pod["metadata"]["annotations"] = {**(pod["metadata"].get("annotations") or {}), **annotations}
        conditions = pod.setdefault("status", {}).setdefault("conditions", [])
        conditions[:] = [c for c in conditions if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "True"})
        self.bindings += 1
        self._write(PODS, pod, "MODIFIED")

    async def replace_lease(self, lease: Obj) -> Obj:
        await self._io()
        meta = lease.get("metadata", {})
        namespace, name = meta.get("namespace", "default"), meta.get("name", "")
        current = self._get(LEASES, namespace, name)
        self._check_rv(current, meta.get("resourceVersion"), f"lease {namespace}/{name}")
        new = copy_obj(lease)
        new["metadata"] = {**current["metadata"], **{k: v for k, v in meta.items() if k != "resourceVersion"}}
        new["kind"] = "Lease"
        new["apiVersion"] = LEASES.api_version
        current.clear()
        current.update(new)
        return self._write(LEASES, current, "MODIFIED")

    async def create_event(self, event: Obj) -> None:
        await self._io()
        self.events.append(copy_obj(event))

    async def close(self) -> None:
        """End every open watch stream (their iterators return)."""
        for kind in self._kinds.values():
            for q in list(kind.watchers):
                q.put_nowait(_CLOSED)
