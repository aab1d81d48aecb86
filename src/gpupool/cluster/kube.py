"""The `kube` adapter: the cluster port on a real API server through lightkube (asyncio).

lightkube models never leave this module: everything is converted to Kubernetes-shaped dicts
(`to_obj`) on the way in and built from dicts on the way out; lightkube errors become port errors
(`translate_error`). Annotation writes are JSON merge patches that carry `metadata.resourceVersion`,
which the API server treats as a precondition (409 when stale).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from lightkube import ALL_NS, AsyncClient, KubeConfig
from lightkube.core.exceptions import ApiError as LightkubeApiError
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Event, Node, Pod, PodBinding
from lightkube.types import PatchType

from gpupool.cluster.port import AlreadyExists, ApiError, Conflict, Gone, Invalid, NotFound, Obj, WatchEvent

FIELD_MANAGER = "gpupool"


def to_obj(model: Any) -> Obj:
    """A lightkube model as a plain Kubernetes JSON dict."""
    return dict(model.to_dict())


def translate_error(e: LightkubeApiError) -> ApiError:
    status = e.status
    code = int(getattr(status, "code", 0) or 0)
    reason = str(getattr(status, "reason", "") or "")
    message = str(getattr(status, "message", "") or e)
    if code == 404:
        return NotFound(message)
    if code == 409:
        return AlreadyExists(message) if reason == "AlreadyExists" else Conflict(message)
    if code == 410:
        return Gone(message)
    if code in (400, 422):
        return Invalid(message)
    err = ApiError(message)
    err.status = code or 500
    return err


def annotation_patch(annotations: Mapping[str, str | None], resource_version: str | None) -> Obj:
    """Merge-patch body that sets/removes annotations, with an optional resourceVersion precondition."""
    meta: Obj = {"annotations": dict(annotations)}
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    return {"metadata": meta}


def binding_for(
    namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
) -> PodBinding:
    """The pods/binding body. The API server copies the Binding's annotations onto the pod in the same
    write that sets spec.nodeName (pod storage `setPodHostAndAnnotations`, there since Kubernetes 1.x)."""
    return PodBinding(
        metadata=ObjectMeta(name=name, namespace=namespace, uid=uid, annotations=dict(annotations or {}) or None),
        target=ObjectReference(apiVersion="v1", kind="Node", name=node),
    )


def _namespaced(obj: Obj) -> Obj:
    """The object with metadata.namespace set (lightkube takes the namespace of a create from it)."""
    meta = dict(obj.get("metadata") or {})
    meta.setdefault("namespace", "default")
    return {**obj, "metadata": meta}


class KubeCluster:
    """Implements `gpupool.cluster.port.ClusterPort` with a lightkube AsyncClient."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    @classmethod
    def from_config(cls, kubeconfig: str | None = None, context: str | None = None) -> KubeCluster:
        """`kubeconfig` None = in-cluster service account."""
        config = KubeConfig.from_service_account() if kubeconfig is None else KubeConfig.from_file(kubeconfig)
        return cls(AsyncClient(config=config.get(context_name=context), field_manager=FIELD_MANAGER))

    @classmethod
    def from_server(cls, url: str, token: str = "unused") -> KubeCluster:
        """A client for `url` with a bearer token (tests, and API servers reached through a proxy)."""
        config = KubeConfig.from_dict({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "server", "cluster": {"server": url}}],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [{"name": "server", "context": {"cluster": "server", "user": "user"}}],
            "current-context": "server",
        })
        return cls(AsyncClient(config=config, field_manager=FIELD_MANAGER))

    async def _call(self, coro: Any) -> Any:
        try:
            return await coro
        except LightkubeApiError as e:
            raise translate_error(e) from None

    async def _list(self, res: Any) -> tuple[list[Obj], str]:
        # Namespaced kinds are listed and watched across all namespaces, not the client's default one.
        it = self.client.list(res, namespace=ALL_NS) if res is Pod else self.client.list(res)
        try:
            items = [to_obj(o) async for o in it]
        except LightkubeApiError as e:
            raise translate_error(e) from None
        return items, str(it.resourceVersion)

    async def _watch(self, res: Any, resource_version: str) -> AsyncIterator[WatchEvent]:
        try:
            if res is Pod:
                events = self.client.watch(res, namespace=ALL_NS, resource_version=resource_version)
            else:
                events = self.client.watch(res, resource_version=resource_version)
            async for type_, obj in events:
                yield WatchEvent(str(type_), to_obj(obj))
        except LightkubeApiError as e:
            raise translate_error(e) from None
        except Exception as e:
            # A streamed answer fails with the HTTP client's status error before lightkube reads the Status
            # body (httpx or httpx2 depending on the lightkube version): map it by its status code.
            code = getattr(getattr(e, "response", None), "status_code", None)
            if code is None:
                raise
            if code == 410:
                raise Gone(f"watch from resourceVersion {resource_version}: expired") from None
            err = NotFound(str(e)) if code == 404 else ApiError(str(e))
            raise err from None

    # --- reading --------------------------------------------------------------------------------------

    async def list_nodes(self) -> tuple[list[Obj], str]:
        return await self._list(Node)

    async def list_pods(self) -> tuple[list[Obj], str]:
        return await self._list(Pod)

    def watch_nodes(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        return self._watch(Node, resource_version)

    def watch_pods(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        return self._watch(Pod, resource_version)

    async def get_node(self, name: str) -> Obj:
        return to_obj(await self._call(self.client.get(Node, name)))

    async def get_pod(self, namespace: str, name: str) -> Obj:
        return to_obj(await self._call(self.client.get(Pod, name, namespace=namespace)))

    # --- writing --------------------------------------------------------------------------------------

    async def create_node(self, node: Obj) -> Obj:
        return to_obj(await self._call(self.client.create(Node.from_dict(node))))

    async def create_pod(self, pod: Obj) -> Obj:
        return to_obj(await self._call(self.client.create(Pod.from_dict(_namespaced(pod)))))

    async def delete_pod(self, namespace: str, name: str, uid: str | None = None) -> None:
        if uid is None:
            await self._call(self.client.delete(Pod, name, namespace=namespace))
            return
        # lightkube's delete has no preconditions: send DeleteOptions ourselves.
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        await self._call(self._delete_with_body(namespace, name, body))

    async def _delete_with_body(self, namespace: str, name: str, body: Obj) -> None:
        http = self.client._client._client  # the underlying httpx client (authenticated, base URL set)
        r = await http.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", json=body)
        if r.status_code >= 400:
            raise LightkubeApiError(request=r.request, response=r)

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Obj:
        body = annotation_patch(annotations, resource_version)
        return to_obj(await self._call(
            self.client.patch(Pod, name, body, namespace=namespace, patch_type=PatchType.MERGE)
        ))

    async def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str | None = None
    ) -> Obj:
        body = annotation_patch(annotations, resource_version)
        return to_obj(await self._call(self.client.patch(Node, name, body, patch_type=PatchType.MERGE)))

    async def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> Obj:
        body = {"metadata": {"labels": dict(labels)}}
        return to_obj(await self._call(self.client.patch(Node, name, body, patch_type=PatchType.MERGE)))

    async def patch_pod_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> Obj:
        body = {"status": dict(status)}
        return to_obj(await self._call(
            self.client.patch(Pod.Status, name, body, namespace=namespace, patch_type=PatchType.MERGE)
        ))

    async def create_binding(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        # Posted directly: the API server answers a Binding with a Status object, which lightkube's `create`
        # would try to decode as a Binding (and fail on a successful bind).
        body = to_obj(binding_for(namespace, name, uid, node, annotations))
        body.update(apiVersion="v1", kind="Binding")
        await self._call(self._post(f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body))

    async def _post(self, path: str, body: Obj) -> None:
        http = self.client._client._client  # the underlying HTTP client (authenticated, base URL set)
        r = await http.request("POST", path, json=body)
        if r.status_code >= 400:
            raise LightkubeApiError(request=r.request, response=r)

    # --- coordination and events ----------------------------------------------------------------------

    async def get_lease(self, namespace: str, name: str) -> Obj:
        return to_obj(await self._call(self.client.get(Lease, name, namespace=namespace)))

    async def create_lease(self, lease: Obj) -> Obj:
        return to_obj(await self._call(self.client.create(Lease.from_dict(_namespaced(lease)))))

    async def replace_lease(self, lease: Obj) -> Obj:
        meta = lease["metadata"]
        return to_obj(await self._call(
            self.client.replace(Lease.from_dict(lease), meta["name"], namespace=meta.get("namespace", "default"))
        ))

    async def create_event(self, event: Obj) -> None:
        await self._call(self.client.create(Event.from_dict(_namespaced(event))))

    async def close(self) -> None:
        await self.client.close()
