"""The interface both cluster adapters implement, and the errors they raise.

Semantics follow the Kubernetes API server, because the scheduler's safety depends on them:
- every write bumps the object's `metadata.resourceVersion`;
- a write that names a `resourceVersion` (precondition) fails with `Conflict` (HTTP 409) when the object
  changed in between; a Binding fails with `Conflict` when the pod is already bound or its UID differs;
- `watch_*` streams ADDED/MODIFIED/DELETED events after a given resourceVersion and raises `Gone` (410)
  when that version is too old, after which the caller lists again.

Objects returned by the port belong to the caller (copies); objects inside watch events are shared
between watchers and must be treated as read-only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

Obj = dict[str, Any]


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


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED
    object: Obj


class ClusterPort(Protocol):
    """What services may do with the cluster. Both adapters implement all of it."""

    # --- reading ----------------------------------------------------------------------------------------
    async def list_nodes(self) -> tuple[list[Obj], str]:
        """All nodes and the list's resourceVersion (start a watch from it)."""
        ...

    async def list_pods(self) -> tuple[list[Obj], str]: ...

    def watch_nodes(self, resource_version: str) -> AsyncIterator[WatchEvent]: ...

    def watch_pods(self, resource_version: str) -> AsyncIterator[WatchEvent]: ...

    async def get_node(self, name: str) -> Obj: ...

    async def get_pod(self, namespace: str, name: str) -> Obj: ...

    # --- writing ----------------------------------------------------------------------------------------
    async def create_node(self, node: Obj) -> Obj: ...

    async def create_pod(self, pod: Obj) -> Obj: ...

    async def delete_pod(self, namespace: str, name: str, uid: str | None = None) -> None:
        """Delete a pod (graceful: with finalizers it only gets a deletionTimestamp). `uid` is a
        precondition: a different pod of the same name is left alone (Conflict)."""
        ...

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Obj:
        """Merge `annotations` into the pod (None removes a key). With `resource_version`, fail with
        Conflict unless the pod is still at that version."""
        ...

    async def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Obj: ...

    async def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> Obj:
        """Merge `labels` into the node's labels (None removes a key); last writer wins (the node agent
        owns its gpupool.io/* labels)."""
        ...

    async def patch_pod_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> Obj:
        """Merge into `status` (the kubelet's job; the embedded cluster's fake kubelet uses it)."""
        ...

    async def create_binding(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        """Bind the pod to `node` (sets spec.nodeName once) and merge `annotations` into the pod in the
        same write. Conflict if it is already bound (or, where the server checks, its UID is not `uid`);
        NotFound if it does not exist."""
        ...

    # --- coordination and events ------------------------------------------------------------------------
    async def get_lease(self, namespace: str, name: str) -> Obj: ...

    async def create_lease(self, lease: Obj) -> Obj: ...

    async def replace_lease(self, lease: Obj) -> Obj:
        """Replace a Lease; its metadata.resourceVersion is a precondition (Conflict when stale)."""
        ...

    async def create_event(self, event: Obj) -> None: ...

    async def close(self) -> None: ...
