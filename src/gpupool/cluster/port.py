"""The interface both cluster adapters implement, and the errors they raise.

Semantics follow the Kubernetes API server, because the scheduler's safety depends on them:
- every write bumps the object's `metadata.resourceVersion`;
- a write that names a `resourceVersion` (precondition) fails with `Conflict` (HTTP 409) when the object
  changed in between; a Binding fails with `Conflict` when the pod is already bound or its UID differs;
- `watch_*` streams ADDED/MODIFIED/DELETED events after a given resourceVersion and raises `Gone` (410)
  when that version is too old, after which the caller lists again.

Objects returned by the port belong to the caller (copies); objects inside watch events are shared
between watchers and must be treated as read-only.

Any kind is reached through the generic methods (`get_object`, `list_objects`, `watch_objects`,
`create_object`, `patch_object`, `delete_object`) and a `Kind`: core kinds, custom resources and
`resource.k8s.io`. The Node/Pod/Lease/Event methods are the same operations, named for the callers
that use them most. Selectors are equality maps (`{"spec.nodeName": "n1"}`), joined with AND, as the
API server's `labelSelector=a=b,c=d` and `fieldSelector=` parameters; the field paths a kind accepts
are the API server's (every kind: `metadata.name`, `metadata.namespace`; pods also `spec.nodeName`,
`spec.schedulerName`, `status.phase` and a few more); others are `Invalid`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

Obj = dict[str, Any]
Selector = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Kind:
    """A Kubernetes resource type as the API server names it: `group` "" is the core group."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


NODES = Kind("", "v1", "Node", "nodes", namespaced=False)
PODS = Kind("", "v1", "Pod", "pods", namespaced=True)
EVENTS = Kind("", "v1", "Event", "events", namespaced=True)
NAMESPACES = Kind("", "v1", "Namespace", "namespaces", namespaced=False)
CONFIGMAPS = Kind("", "v1", "ConfigMap", "configmaps", namespaced=True)
LEASES = Kind("coordination.k8s.io", "v1", "Lease", "leases", namespaced=True)
CRDS = Kind("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", namespaced=False)
# Dynamic Resource Allocation (GA in Kubernetes 1.34: resource.k8s.io/v1).
RESOURCE_SLICES = Kind("resource.k8s.io", "v1", "ResourceSlice", "resourceslices", namespaced=False)
RESOURCE_CLAIMS = Kind("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims", namespaced=True)
RESOURCE_CLAIM_TEMPLATES = Kind("resource.k8s.io", "v1", "ResourceClaimTemplate", "resourceclaimtemplates",
                                namespaced=True)
DEVICE_CLASSES = Kind("resource.k8s.io", "v1", "DeviceClass", "deviceclasses", namespaced=False)
PDBS = Kind("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", namespaced=True)

# Field selectors each kind accepts besides metadata.name / metadata.namespace (the API server's
# per-kind field label conversion functions); a custom resource accepts only those two.
FIELD_LABELS: dict[tuple[str, str], frozenset[str]] = {
    ("v1", "Pod"): frozenset({
        "spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
        "status.phase", "status.podIP", "status.nominatedNodeName",
    }),
    ("v1", "Node"): frozenset({"spec.unschedulable"}),
    ("v1", "Event"): frozenset({
        "involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
        "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
        "reason", "source", "type",
    }),
}


def field_labels(kind: Kind) -> frozenset[str]:
    """The field selector paths the API server accepts for `kind`."""
    common = frozenset({"metadata.name", "metadata.namespace"})
    return common | FIELD_LABELS.get((kind.api_version, kind.kind), frozenset())


class ApiError(Exception):
    """An API call failed; `status` is the HTTP status the API server would answer."""

    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(ApiError):
    status = 404


class Conflict(ApiError):
    """Stale resourceVersion, failed UID precondition, or a pod that is already bound."""

    status = 409


class AlreadyExists(ApiError):
    status = 409


class Gone(ApiError):
    """The resourceVersion a watch started from is no longer available: list again."""

    status = 410


class Invalid(ApiError):
    status = 422


class TooManyRequests(ApiError):
    """429: an eviction a PodDisruptionBudget forbids right now (or the API server's rate limit): not now,
    try later or another victim."""

    status = 429


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED
    object: Obj


class ClusterPort(Protocol):
    """What services may do with the cluster. Both adapters implement all of it."""

    # --- any kind ---------------------------------------------------------------------------------------
    async def get_object(self, kind: Kind, name: str, namespace: str | None = None) -> Obj:
        """One object; `namespace` is required for namespaced kinds."""
        ...

    async def list_objects(
        self, kind: Kind, *, namespace: str | None = None, labels: Selector | None = None,
        fields: Selector | None = None,
    ) -> tuple[list[Obj], str]:
        """The matching objects (every namespace when `namespace` is None) and the list's resourceVersion."""
        ...

    def watch_objects(
        self, kind: Kind, resource_version: str, *, namespace: str | None = None, labels: Selector | None = None,
        fields: Selector | None = None,
    ) -> AsyncIterator[WatchEvent]:
        """Changes after `resource_version`. With selectors, as the API server does: an object that starts
        matching arrives as ADDED, one that stops matching as DELETED."""
        ...

    async def create_object(self, kind: Kind, obj: Obj, *, dry_run: bool = False) -> Obj:
        """Create; a namespaced object without metadata.namespace goes to `default`. With `dry_run` the server
        admits and validates it (webhooks included, as `kubectl create --dry-run=server`) and answers the
        object as it would have stored it, storing nothing."""
        ...

    async def patch_object(
        self, kind: Kind, name: str, patch: Mapping[str, Any], *, namespace: str | None = None,
        resource_version: str | None = None, subresource: str | None = None,
    ) -> Obj:
        """JSON merge patch (RFC 7386: None removes a key). With `resource_version`, Conflict unless the
        object is still at that version. `subresource` "status" patches the status subresource."""
        ...

    async def delete_object(
        self, kind: Kind, name: str, *, namespace: str | None = None, uid: str | None = None
    ) -> None:
        """Delete (graceful: with finalizers it only gets a deletionTimestamp); `uid` is a precondition."""
        ...

    # --- Node/Pod/Lease shortcuts: the generic methods, named for the callers that use them most ----------
    # Written once here; both adapters inherit them (they subclass ClusterPort), so a shortcut means exactly
    # its generic call in either.

    async def list_nodes(
        self, *, labels: Selector | None = None, fields: Selector | None = None
    ) -> tuple[list[Obj], str]:
        """All nodes and the list's resourceVersion (start a watch from it)."""
        return await self.list_objects(NODES, labels=labels, fields=fields)

    async def list_pods(
        self, *, labels: Selector | None = None, fields: Selector | None = None
    ) -> tuple[list[Obj], str]:
        """Pods of every namespace; `fields={"spec.nodeName": node}` lists one node's pods."""
        return await self.list_objects(PODS, labels=labels, fields=fields)

    def watch_nodes(
        self, resource_version: str, *, labels: Selector | None = None, fields: Selector | None = None
    ) -> AsyncIterator[WatchEvent]:
        return self.watch_objects(NODES, resource_version, labels=labels, fields=fields)

    def watch_pods(
        self, resource_version: str, *, labels: Selector | None = None, fields: Selector | None = None
    ) -> AsyncIterator[WatchEvent]:
        return self.watch_objects(PODS, resource_version, labels=labels, fields=fields)

    async def get_node(self, name: str) -> Obj:
        return await self.get_object(NODES, name)

    async def get_pod(self, namespace: str, name: str) -> Obj:
        return await self.get_object(PODS, name, namespace)

    async def create_node(self, node: Obj) -> Obj:
        return await self.create_object(NODES, node)

    async def create_pod(self, pod: Obj) -> Obj:
        return await self.create_object(PODS, pod)

    async def delete_pod(self, namespace: str, name: str, uid: str | None = None) -> None:
        """Delete a pod (graceful: with finalizers it only gets a deletionTimestamp). `uid` is a
        precondition: a different pod of the same name is left alone (Conflict)."""
        await self.delete_object(PODS, name, namespace=namespace, uid=uid)

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Obj:
        """Merge `annotations` into the pod (None removes a key). With `resource_version`, fail with
        Conflict unless the pod is still at that version."""
        return await self.patch_object(PODS, name, {"metadata": {"annotations": dict(annotations)}},
                                       namespace=namespace, resource_version=resource_version)

    async def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Obj:
        return await self.patch_object(NODES, name, {"metadata": {"annotations": dict(annotations)}},
                                       resource_version=resource_version)

    async def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> Obj:
        """Merge `labels` into the node's labels (None removes a key); last writer wins (the node agent
        owns its gpupool.io/* labels)."""
        return await self.patch_object(NODES, name, {"metadata": {"labels": dict(labels)}})

    async def patch_pod_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> Obj:
        """Merge into `status` (the kubelet's job; the embedded cluster's fake kubelet uses it)."""
        return await self.patch_object(PODS, name, {"status": dict(status)}, namespace=namespace, subresource="status")

    async def get_lease(self, namespace: str, name: str) -> Obj:
        return await self.get_object(LEASES, name, namespace)

    async def create_lease(self, lease: Obj) -> Obj:
        return await self.create_object(LEASES, lease)

    # --- what each adapter does its own way -----------------------------------------------------------

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        """Evict through the Eviction API (the pod's PodDisruptionBudgets are honoured): the pod is deleted
        gracefully. TooManyRequests when a budget forbids it now; Conflict when `uid` is no longer the pod."""
        ...

    async def create_binding(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        """Bind the pod to `node` (sets spec.nodeName once) and merge `annotations` into the pod in the
        same write. Conflict if it is already bound (or, where the server checks, its UID is not `uid`);
        NotFound if it does not exist."""
        ...

    async def replace_lease(self, lease: Obj) -> Obj:
        """Replace a Lease; its metadata.resourceVersion is a precondition (Conflict when stale)."""
        ...

    async def create_event(self, event: Obj) -> None: ...

    async def close(self) -> None: ...
