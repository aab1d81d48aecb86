"""The embedded cluster: an in-process stand-in for the Kubernetes API server.

It keeps nodes, pods and leases as Kubernetes-shaped dicts and reproduces the behaviour the scheduler
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
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpupool.cluster.port import AlreadyExists, Conflict, Gone, Invalid, NotFound, Obj, WatchEvent

_HISTORY = 50_000  # watch events kept per kind so that watchers can resume after a short gap
_CLOSED = object()


def copy_obj(value: Any) -> Any:
    """Deep copy of JSON-shaped data. marshal round-trips dict/list/str/int/float/bool/None in C, several
    times faster than copy.deepcopy or a recursive copy; anything else raises ValueError."""
    return marshal.loads(marshal.dumps(value))


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Kind:
    """Objects of one kind plus the event history and live watchers."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.objects: dict[tuple[str, str], Obj] = {}
        self.history: deque[tuple[int, WatchEvent]] = deque(maxlen=_HISTORY)
        self.dropped_before = 0  # resourceVersions at or below this may be missing from history
        self.watchers: set[asyncio.Queue[Any]] = set()


class MemoryCluster:
    """Implements `gpupool.cluster.port.ClusterPort` in memory."""

    def __init__(self, clock: Callable[[], float] = time.time, latency_s: float = 0.0) -> None:
        self._clock = clock
        # Every call suspends (for `latency_s`, or just one loop turn) like a network round trip would, so
        # concurrent callers interleave between their reads and writes as they do against a real server.
        self._latency_s = latency_s
        self._rv = 0
        self._kinds = {k: _Kind(k) for k in ("Node", "Pod", "Lease")}
        self.events: deque[Obj] = deque(maxlen=10_000)  # Kubernetes Events, newest last
        self.bindings = 0  # number of successful Bindings (tests count them)

    async def _io(self) -> None:
        await asyncio.sleep(self._latency_s)

    # --- internals -------------------------------------------------------------------------------------

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _emit(self, kind: _Kind, type_: str, obj: Obj) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        event = WatchEvent(type_, copy_obj(obj))
        if len(kind.history) == kind.history.maxlen:
            kind.dropped_before = kind.history[0][0]
        kind.history.append((rv, event))
        for q in kind.watchers:
            q.put_nowait(event)

    def _get(self, kind: str, namespace: str, name: str) -> Obj:
        obj = self._kinds[kind].objects.get((namespace, name))
        if obj is None:
            where = f"{namespace}/{name}" if namespace else name
            raise NotFound(f"{kind.lower()} {where} not found")
        return obj

    def _check_rv(self, obj: Obj, resource_version: str | None, what: str) -> None:
        current = obj["metadata"]["resourceVersion"]
        if resource_version is not None and resource_version != current:
            raise Conflict(
                f"{what}: the object has been modified (resourceVersion {resource_version} != {current}); "
                "read it again and retry"
            )

    def _write(self, kind: str, obj: Obj, type_: str) -> Obj:
        obj["metadata"]["resourceVersion"] = self._next_rv()
        k = self._kinds[kind]
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        k.objects[key] = obj
        self._emit(k, type_, obj)
        return copy_obj(obj)

    def _create(self, kind: str, obj: Obj, namespaced: bool) -> Obj:
        obj = copy_obj(obj)
        meta = obj.setdefault("metadata", {})
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise Invalid(f"{kind.lower()}: metadata.name is required")
        if namespaced:
            meta.setdefault("namespace", "default")
        else:
            meta.pop("namespace", None)
        key = (meta.get("namespace", ""), name)
        if key in self._kinds[kind].objects:
            raise AlreadyExists(f"{kind.lower()} {name} already exists")
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339(self._clock())
        obj.setdefault("apiVersion", "coordination.k8s.io/v1" if kind == "Lease" else "v1")
        obj["kind"] = kind
        return self._write(kind, obj, "ADDED")

    def _list(self, kind: str) -> tuple[list[Obj], str]:
        return [copy_obj(o) for o in self._kinds[kind].objects.values()], str(self._rv)

    async def _watch(self, kind_name: str, resource_version: str) -> AsyncIterator[WatchEvent]:
        await self._io()
        kind = self._kinds[kind_name]
        start = int(resource_version or 0)
        if start < kind.dropped_before:
            raise Gone(f"watch {kind_name.lower()}s from resourceVersion {start}: too old, list again")
        queue: asyncio.Queue[Any] = asyncio.Queue()
        # Replay and registration happen without an await in between, so no event is lost or doubled.
        backlog = [e for rv, e in kind.history if rv > start]
        kind.watchers.add(queue)
        try:
            for event in backlog:
                yield event
            while True:
                item = await queue.get()
                if item is _CLOSED:
                    return
                yield item
        finally:
            kind.watchers.discard(queue)

    @staticmethod
    def _merge_annotations(obj: Obj, annotations: Mapping[str, str | None], field: str = "annotations") -> None:
        current = obj["metadata"].setdefault(field, {})
        for key, value in annotations.items():
            if value is None:
                current.pop(key, None)
            elif not isinstance(value, str):
                raise Invalid(f"{field[:-1]} {key}: value must be a string, got {type(value).__name__}")
            else:
                current[key] = value

    # --- ClusterPort: reading ---------------------------------------------------------------------------

    async def list_nodes(self) -> tuple[list[Obj], str]:
        await self._io()
        return self._list("Node")

    async def list_pods(self) -> tuple[list[Obj], str]:
        await self._io()
        return self._list("Pod")

    def watch_nodes(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        return self._watch("Node", resource_version)

    def watch_pods(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        return self._watch("Pod", resource_version)

    async def get_node(self, name: str) -> Obj:
        await self._io()
        return copy_obj(self._get("Node", "", name))

    async def get_pod(self, namespace: str, name: str) -> Obj:
        await self._io()
        return copy_obj(self._get("Pod", namespace, name))

    # --- ClusterPort: writing ---------------------------------------------------------------------------

    async def create_node(self, node: Obj) -> Obj:
        await self._io()
        return self._create("Node", node, namespaced=False)

    async def create_pod(self, pod: Obj) -> Obj:
        await self._io()
        pod = copy_obj(pod)
        status = pod.setdefault("status", {})
        status.setdefault("phase", "Pending")
        return self._create("Pod", pod, namespaced=True)

    async def delete_pod(self, namespace: str, name: str, uid: str | None = None) -> None:
        await self._io()
        pod = self._get("Pod", namespace, name)
        if uid is not None and pod["metadata"]["uid"] != uid:
            raise Conflict(f"pod {namespace}/{name}: UID precondition failed ({uid} is not the current pod)")
        if pod["metadata"].get("finalizers"):
            if "deletionTimestamp" not in pod["metadata"]:
                pod["metadata"]["deletionTimestamp"] = rfc3339(self._clock())
                self._write("Pod", pod, "MODIFIED")
            return
        self._remove("Pod", pod)

    def _remove(self, kind_name: str, obj: Obj) -> None:
        kind = self._kinds[kind_name]
        del kind.objects[(obj["metadata"].get("namespace", ""), obj["metadata"]["name"])]
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._emit(kind, "DELETED", obj)

    async def remove_finalizers(self, namespace: str, name: str) -> None:
        """Memory-only helper: what a controller does when it is done; finishes a pending deletion."""
        await self._io()
        pod = self._get("Pod", namespace, name)
        pod["metadata"].pop("finalizers", None)
        if "deletionTimestamp" in pod["metadata"]:
            self._remove("Pod", pod)
        else:
            self._write("Pod", pod, "MODIFIED")

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Obj:
        await self._io()
        pod = self._get("Pod", namespace, name)
        self._check_rv(pod, resource_version, f"pod {namespace}/{name}")
        self._merge_annotations(pod, annotations)
        return self._write("Pod", pod, "MODIFIED")

    async def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Obj:
        await self._io()
        node = self._get("Node", "", name)
        self._check_rv(node, resource_version, f"node {name}")
        self._merge_annotations(node, annotations)
        return self._write("Node", node, "MODIFIED")

    async def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> Obj:
        await self._io()
        node = self._get("Node", "", name)
        self._merge_annotations(node, labels, "labels")
        return self._write("Node", node, "MODIFIED")

    async def patch_pod_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> Obj:
        await self._io()
        pod = self._get("Pod", namespace, name)
        pod.setdefault("status", {}).update(copy_obj(dict(status)))
        return self._write("Pod", pod, "MODIFIED")

    async def create_binding(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        await self._io()
        pod = self._get("Pod", namespace, name)
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
        self._write("Pod", pod, "MODIFIED")

    # --- ClusterPort: coordination and events -----------------------------------------------------------

    async def get_lease(self, namespace: str, name: str) -> Obj:
        await self._io()
        return copy_obj(self._get("Lease", namespace, name))

    async def create_lease(self, lease: Obj) -> Obj:
        await self._io()
        return self._create("Lease", lease, namespaced=True)

    async def replace_lease(self, lease: Obj) -> Obj:
        await self._io()
        meta = lease.get("metadata", {})
        namespace, name = meta.get("namespace", "default"), meta.get("name", "")
        current = self._get("Lease", namespace, name)
        self._check_rv(current, meta.get("resourceVersion"), f"lease {namespace}/{name}")
        new = copy_obj(lease)
        new["metadata"] = {**current["metadata"], **{k: v for k, v in meta.items() if k != "resourceVersion"}}
        new["kind"] = "Lease"
        new.setdefault("apiVersion", "coordination.k8s.io/v1")
        return self._write("Lease", new, "MODIFIED")

    async def create_event(self, event: Obj) -> None:
        await self._io()
        self.events.append(copy_obj(event))

    async def close(self) -> None:
        """End every open watch stream (their iterators return)."""
        for kind in self._kinds.values():
            for q in list(kind.watchers):
                q.put_nowait(_CLOSED)
