"""The few cluster operations the agent needs, and the adapter onto gpupool.cluster's ClusterPort.

Kept narrow on purpose: the agent reads its own node and the pods bound to it (a `spec.nodeName` field
selector), and writes only annotations, labels and its own condition (`GpupoolReady`, status subresource)
on its node, one annotation on pods it served, and
Events about pods of its node whose processes the watchdog stopped or reported (least privilege for the
DaemonSet's RBAC: nodes get/patch, nodes/status patch, pods list/get/patch, events create). As a DRA
driver it also reads ResourceClaims (get) and writes its node's ResourceSlice (get, create, patch). Serving
remote shares (gpupool.agent.remote.serving) it lists and watches ResourceClaims of every namespace: a remote claim
on its GPUs may belong to a pod on any node. With remote shares it also reads and updates one ConfigMap in
gpupool's own namespace, the moves of remote shares (gpupool.api.moves.MOVES_CONFIGMAP): get, and list and
watch with the field selector metadata.name (RBAC's resourceNames admit a list or watch only with it),
and merge patches of its data with the resourceVersion read (a Conflict: read again).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from gpupool.api.moves import MOVES_CONFIGMAP
from gpupool.cluster.port import (
    CONFIGMAPS,
    NODES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ClusterPort,
    NotFound,
    WatchEvent,
)

Obj = dict[str, Any]
_MOVES_ONLY = {"metadata.name": MOVES_CONFIGMAP}  # the one ConfigMap the agent's Role names


class AgentCluster(Protocol):
    async def get_node(self, name: str) -> Obj: ...

    async def get_pod(self, namespace: str, name: str) -> Obj: ...

    async def list_pods_on_node(self, node: str) -> list[Obj]: ...

    async def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Obj: ...

    async def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> Obj: ...

    async def patch_node_conditions(self, name: str, conditions: list[Obj], resource_version: str) -> Obj: ...

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Obj: ...


    async def create_event(self, event: Obj) -> None: ...

    # DRA (gpupool.agent.dra.driver): read the claims kubelet asks to prepare, write this node's ResourceSlice
    async def get_claim(self, namespace: str, name: str) -> Obj: ...

    async def get_slice(self, name: str) -> Obj | None: ...

    async def create_slice(self, obj: Obj) -> Obj: ...

    async def patch_slice(self, name: str, patch: Obj, resource_version: str) -> Obj: ...

    async def delete_slice(self, name: str) -> None: ...

    # remote shares (gpupool.agent.remote.serving): every claim, to serve those allocated on this node's GPUs
    async def list_claims(self) -> tuple[list[Obj], str]: ...

    def watch_claims(self, resource_version: str) -> AsyncIterator[WatchEvent]: ...

    # moves of remote shares (gpupool.api.moves): the one ConfigMap in gpupool's namespace
    async def list_moves(self, namespace: str) -> tuple[list[Obj], str]: ...

    def watch_moves(self, namespace: str, resource_version: str) -> AsyncIterator[WatchEvent]: ...

    async def get_moves(self, namespace: str) -> Obj | None: ...

    async def update_moves(self, namespace: str, entries: Mapping[str, str], resource_version: str) -> Obj: ...


class LabelsUnsupported(RuntimeError):
    pass


class ClusterPortAgent:
    """AgentCluster over a ClusterPort (memory or kube adapter)."""

    def __init__(self, port: ClusterPort) -> None:
        self.port = port

    async def get_node(self, name: str) -> Obj:
        return await self.port.get_node(name)

    async def get_pod(self, namespace: str, name: str) -> Obj:
        return await self.port.get_pod(namespace, name)

    async def list_pods_on_node(self, node: str) -> list[Obj]:
        # The API server filters by spec.nodeName: an Allocate never reads, nor is allowed to need, the pods
        # of the rest of the cluster. The filter below only guards against an adapter that ignored it.
        pods, _ = await self.port.list_pods(fields={"spec.nodeName": node})
        return [p for p in pods if (p.get("spec") or {}).get("nodeName") == node]

    async def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Obj:
        return await self.port.patch_node_annotations(name, annotations, resource_version)

    async def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> Obj:
        patch = getattr(self.port, "patch_node_labels", None)
        if patch is None:
            raise LabelsUnsupported("the cluster adapter has no patch_node_labels; node labels not published")
        result: Obj = await patch(name, labels)
        return result

    async def patch_node_conditions(self, name: str, conditions: list[Obj], resource_version: str) -> Obj:
        """Replace the node's `status.conditions` (the whole list: a merge patch cannot change one entry),
        only if the node is still at `resource_version`, so a condition kubelet wrote in between is never
        lost (Conflict: read again and retry)."""
        return await self.port.patch_object(NODES, name, {"status": {"conditions": conditions}},
                                            resource_version=resource_version, subresource="status")

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Obj:
        return await self.port.patch_pod_annotations(namespace, name, annotations, resource_version)

    async def create_event(self, event: Obj) -> None:
        await self.port.create_event(event)

    async def get_claim(self, namespace: str, name: str) -> Obj:
        return await self.port.get_object(RESOURCE_CLAIMS, name, namespace)

    async def get_slice(self, name: str) -> Obj | None:
        try:
            return await self.port.get_object(RESOURCE_SLICES, name)
        except NotFound:
            return None

    async def create_slice(self, obj: Obj) -> Obj:
        return await self.port.create_object(RESOURCE_SLICES, obj)

    async def patch_slice(self, name: str, patch: Obj, resource_version: str) -> Obj:
        return await self.port.patch_object(RESOURCE_SLICES, name, patch, resource_version=resource_version)

    async def delete_slice(self, name: str) -> None:
        await self.port.delete_object(RESOURCE_SLICES, name)

    async def list_claims(self) -> tuple[list[Obj], str]:
        return await self.port.list_objects(RESOURCE_CLAIMS)

    def watch_claims(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        return self.port.watch_objects(RESOURCE_CLAIMS, resource_version)

    async def list_moves(self, namespace: str) -> tuple[list[Obj], str]:
        return await self.port.list_objects(CONFIGMAPS, namespace=namespace, fields=_MOVES_ONLY)

    def watch_moves(self, namespace: str, resource_version: str) -> AsyncIterator[WatchEvent]:
        return self.port.watch_objects(CONFIGMAPS, resource_version, namespace=namespace, fields=_MOVES_ONLY)

    async def get_moves(self, namespace: str) -> Obj | None:
        """The moves ConfigMap; None when there is none (no moves were ever asked)."""
        try:
            return await self.port.get_object(CONFIGMAPS, MOVES_CONFIGMAP, namespace)
        except NotFound:
            return None

    async def update_moves(self, namespace: str, entries: Mapping[str, str], resource_version: str) -> Obj:
        """Set these entries (claim UID -> a Move's JSON) if the ConfigMap is still at `resource_version`
        (Conflict otherwise: another writer came first; read again)."""
        return await self.port.patch_object(CONFIGMAPS, MOVES_CONFIGMAP, {"data": dict(entries)},
                                            namespace=namespace, resource_version=resource_version)
