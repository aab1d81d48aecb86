"""The `kube` adapter: the cluster port on a real API server through lightkube (asyncio).

lightkube models never leave this module: everything is converted to Kubernetes-shaped dicts
(`to_obj`) on the way in and built from dicts on the way out; lightkube errors become port errors
(`translate_error`). Patches are JSON merge patches; one with a precondition carries
`metadata.resourceVersion`, which the API server treats as such (409 when stale).

Any kind goes through one lightkube resource class per `Kind`: lightkube's own typed class for the kinds
lightkube-models knows, a generic resource (`create_global_resource` / `create_namespaced_resource`) for
custom resources and kinds newer than the installed models.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from lightkube import ALL_NS, AsyncClient, KubeConfig
from lightkube.core.exceptions import ApiError as LightkubeApiError
from lightkube.core.exceptions import LoadResourceError
from lightkube.core.resource_registry import resource_registry
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Event, PodBinding
from lightkube.types import PatchType

from gpupool.cluster.port import (
    PODS,
    AlreadyExists,
    ApiError,
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
)

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
    if code == 429:
        return TooManyRequests(message)
    err = ApiError(message)
    err.status = code or 500
    return err


def binding_for(
    namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
) -> PodBinding:
    """The pods/binding body. The API server copies the Binding's annotations onto the pod in the same
    write that sets spec.nodeName (pod storage `setPodHostAndAnnotations`, there since Kubernetes 1.x)."""
    return PodBinding(
        metadata=ObjectMeta(name=name, namespace=namespace, uid=uid, annotations=dict(annotations or {}) or None),
        target=ObjectReference(apiVersion="v1", kind="Node", name=node),
    )


def kind_path(kind: Kind, namespace: str | None = None, name: str | None = None) -> str:
    """The REST path of a kind's collection or of one object."""
    parts = ["/api", kind.version] if not kind.group else ["/apis", kind.group, kind.version]
    if kind.namespaced and namespace is not None:
        parts += ["namespaces", namespace]
    parts.append(kind.plural)
    if name is not None:
        parts.append(name)
    return "/".join(parts)


def _by_status_code(e: Exception, context: str) -> Exception:
    """An HTTP client error that lightkube did not turn into its ApiError — a streamed answer fails before
    lightkube reads the Status body, and a 404 for a kind the server does not serve is plain text — as the
    port's error for its status code; anything else (a transport error) unchanged."""
    code = getattr(getattr(e, "response", None), "status_code", None)
    if not isinstance(code, int):
        return e
    message = f"{context}{e}".splitlines()[0]
    if code == 410:
        return Gone(message)
    if code in (400, 422):
        return Invalid(message)
    if code == 404:
        return NotFound(message)
    if code == 409:
        return Conflict(message)
    err = ApiError(message)
    err.status = code
    return err


def _selector(selector: Selector | None) -> Any:
    return dict(selector) if selector else None


def _built_in(group: str) -> bool:
    return group in ("", "apps", "batch", "policy", "autoscaling") or group.endswith(".k8s.io")


def _namespaced(obj: Obj) -> Obj:
    """The object with metadata.namespace set (lightkube takes the namespace of a create from it)."""
    meta = dict(obj.get("metadata") or {})
    meta.setdefault("namespace", "default")
    return {**obj, "metadata": meta}


class KubeCluster(ClusterPort):
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

    def _resource(self, kind: Kind) -> Any:
        """The lightkube resource class for `kind` (one per kind and process: lightkube keeps a registry)."""
        found = resource_registry.get(kind.api_version, kind.kind)
        if found is not None:
            return found
        if _built_in(kind.group):
            try:
                return resource_registry.load(kind.api_version, kind.kind)
            except LoadResourceError:
                pass  # a kind newer than lightkube-models: served as a generic resource below
        create = create_namespaced_resource if kind.namespaced else create_global_resource
        return create(kind.group, kind.version, kind.kind, kind.plural)

    async def _call(self, coro: Any) -> Any:
        try:
            return await coro
        except LightkubeApiError as e:
            raise translate_error(e) from None
        except Exception as e:
            raise _by_status_code(e, "") from None

    async def _list(
        self, kind: Kind, namespace: str | None, labels: Selector | None, fields: Selector | None
    ) -> tuple[list[Obj], str]:
        res = self._resource(kind)
        # Namespaced kinds are listed and watched across all namespaces, not the client's default one.
        where = (namespace or ALL_NS) if kind.namespaced else None
        it = self.client.list(res, namespace=where, labels=_selector(labels), fields=_selector(fields))
        try:
            items = [to_obj(o) async for o in it]
        except LightkubeApiError as e:
            raise translate_error(e) from None
        except Exception as e:
            raise _by_status_code(e, "") from None
        return items, str(it.resourceVersion)

    async def _watch(
        self, kind: Kind, resource_version: str, namespace: str | None = None, labels: Selector | None = None,
        fields: Selector | None = None,
    ) -> AsyncIterator[WatchEvent]:
        res = self._resource(kind)
        where = (namespace or ALL_NS) if kind.namespaced else None
        try:
            events = self.client.watch(
                res, namespace=where, labels=_selector(labels), fields=_selector(fields),
                resource_version=resource_version,
            )
            async for type_, obj in events:
                yield WatchEvent(str(type_), to_obj(obj))
        except LightkubeApiError as e:
            raise translate_error(e) from None
        except Exception as e:
            raise _by_status_code(e, f"watch {kind} from resourceVersion {resource_version}: ") from None

    # --- any kind -------------------------------------------------------------------------------------

    async def get_object(self, kind: Kind, name: str, namespace: str | None = None) -> Obj:
        res = self._resource(kind)
        where = (namespace or "default") if kind.namespaced else None
        return to_obj(await self._call(self.client.get(res, name, namespace=where)))

    async def list_objects(
        self, kind: Kind, *, namespace: str | None = None, labels: Selector | None = None,
        fields: Selector | None = None,
    ) -> tuple[list[Obj], str]:
        return await self._list(kind, namespace, labels, fields)

    def watch_objects(
        self, kind: Kind, resource_version: str, *, namespace: str | None = None, labels: Selector | None = None,
        fields: Selector | None = None,
    ) -> AsyncIterator[WatchEvent]:
        return self._watch(kind, resource_version, namespace, labels, fields)

    async def create_object(self, kind: Kind, obj: Obj, *, dry_run: bool = False) -> Obj:
        body = {**obj, "apiVersion": kind.api_version, "kind": kind.kind}
        if kind.namespaced:
            body = _namespaced(body)
        return to_obj(await self._call(self.client.create(self._resource(kind).from_dict(body), dry_run=dry_run)))

    async def patch_object(
        self, kind: Kind, name: str, patch: Mapping[str, Any], *, namespace: str | None = None,
        resource_version: str | None = None, subresource: str | None = None,
    ) -> Obj:
        body: Obj = dict(patch)
        if resource_version is not None:
            body["metadata"] = {**(body.get("metadata") or {}), "resourceVersion": resource_version}
        res = self._resource(kind)
        if subresource == "status":
            res = res.Status
        elif subresource is not None:
            raise Invalid(f"{kind}: subresource {subresource!r} is not supported by patch_object")
        where = (namespace or "default") if kind.namespaced else None
        return to_obj(await self._call(self.client.patch(res, name, body, namespace=where, patch_type=PatchType.MERGE)))

    async def delete_object(
        self, kind: Kind, name: str, *, namespace: str | None = None, uid: str | None = None
    ) -> None:
        where = (namespace or "default") if kind.namespaced else None
        if uid is None:
            await self._call(self.client.delete(self._resource(kind), name, namespace=where))
            return
        # lightkube's delete has no preconditions: send DeleteOptions ourselves.
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        await self._call(self._request("DELETE", kind_path(kind, where, name), body))

    # --- what the port leaves to each adapter (the Node/Pod/Lease shortcuts are the port's own) ---------

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        path = kind_path(PODS, namespace, name) + "/eviction"
        options = {"preconditions": {"uid": uid}}
        body: Obj = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace},
                     "deleteOptions": options}
        await self._call(self._request("POST", path, body))

    async def create_binding(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        # Posted directly: the API server answers a Binding with a Status object, which lightkube's `create`
        # would try to decode as a Binding (and fail on a successful bind).
        body = to_obj(binding_for(namespace, name, uid, node, annotations))
        body.update(apiVersion="v1", kind="Binding")
        await self._call(self._request("POST", kind_path(PODS, namespace, name) + "/binding", body))

    async def _request(self, method: str, path: str, body: Obj) -> None:
        http = self.client._client._client  # the underlying HTTP client (authenticated, base URL set)
        r = await http.request(method, path, json=body)
        if r.status_code >= 400:
            raise LightkubeApiError(request=r.request, response=r)

    async def replace_lease(self, lease: Obj) -> Obj:
        meta = lease["metadata"]
        return to_obj(await self._call(
            self.client.replace(Lease.from_dict(lease), meta["name"], namespace=meta.get("namespace", "default"))
        ))

    async def create_event(self, event: Obj) -> None:
        await self._call(self.client.create(Event.from_dict(_namespaced(event))))

    async def close(self) -> None:
        await self.client.close()
