"""The lightkube adapter, offline: conversion functions, and the exact requests it sends, checked against a
small recording HTTP server on 127.0.0.1 that answers like the API server would for these calls."""

from __future__ import annotations

import json

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from gpupool.cluster.kube import KubeCluster, binding_for, to_obj
from gpupool.cluster.port import Conflict, Gone, NotFound
from gpupool.scheduler.server import serve_in_background


def _status(code: int, reason: str, message: str) -> JSONResponse:
    body = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "reason": reason,
            "message": message}
    return JSONResponse(body, status_code=code)


POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "p", "namespace": "default", "uid": "u1", "resourceVersion": "1"},
       "spec": {"containers": [{"name": "c", "image": "i"}]}}


class FakeApiServer:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str, dict | None]] = []
        self.queries: list[dict[str, str]] = []
        self.bound = False

    async def handle(self, request: Request) -> JSONResponse:
        raw = await request.body()
        body = json.loads(raw) if raw else None
        path = request.url.path
        self.requests.append((request.method, path, request.headers.get("content-type", ""), body))
        self.queries.append(dict(request.query_params))
        if request.method == "GET" and path == "/api/v1/pods" and request.query_params.get("watch") == "true":
            self.watch_params = dict(request.query_params)
            if request.query_params.get("resourceVersion") == "1":
                return _status(410, "Expired", "too old resource version: 1")
            lines = [{"type": "ADDED", "object": POD}, {"type": "DELETED", "object": POD}]
            return PlainTextResponse("".join(json.dumps(x) + "\n" for x in lines))
        if request.method == "GET" and path == "/api/v1/pods":
            return JSONResponse({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "9"},
                                 "items": [POD]})
        if request.method == "GET" and path == "/api/v1/nodes":
            node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "resourceVersion": "7"}}
            return JSONResponse({"apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": "42"},
                                 "items": [node]})
        if request.method == "GET" and path == "/api/v1/namespaces/default/pods/missing":
            return _status(404, "NotFound", 'pods "missing" not found')
        if request.method == "PATCH" and path == "/api/v1/namespaces/default/pods/p":
            if body["metadata"].get("resourceVersion") not in (None, "1"):
                return _status(409, "Conflict", "the object has been modified")
            pod = json.loads(json.dumps(POD))
            pod["metadata"]["annotations"] = {k: v for k, v in body["metadata"]["annotations"].items() if v}
            pod["metadata"]["resourceVersion"] = "2"
            return JSONResponse(pod)
        if request.method == "POST" and path == "/api/v1/namespaces/default/pods/p/binding":
            if self.bound:
                return _status(409, "Conflict", 'pod p is already assigned to node "n1"')
            self.bound = True
            # Like the API server: a Status answer, not the Binding.
            return JSONResponse({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Success",
                                 "code": 201}, status_code=201)
        if request.method == "PATCH" and path == "/api/v1/nodes/n1":
            node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "resourceVersion": "8",
                                                                      "labels": body["metadata"]["labels"]}}
            return JSONResponse(node)
        if request.method == "DELETE":
            return JSONResponse({"apiVersion": "v1", "kind": "Status", "status": "Success"})
        return _status(404, "NotFound", f"no fake for {request.method} {path}")


@pytest.fixture
async def fake():
    server = FakeApiServer()
    app = Starlette(routes=[Route("/{path:path}", server.handle, methods=["GET", "POST", "PATCH", "DELETE", "PUT"])])
    handle = await serve_in_background(app)
    cluster = KubeCluster.from_server(handle.url)
    yield server, cluster
    await cluster.close()
    await handle.stop()


def test_conversions_keep_kubernetes_json_shape():
    binding = to_obj(binding_for("ns", "p", "uid-1", "node-a"))
    assert binding["metadata"] == {"name": "p", "namespace": "ns", "uid": "uid-1"}
    assert binding["target"] == {"apiVersion": "v1", "kind": "Node", "name": "node-a"}
    annotated = to_obj(binding_for("ns", "p", "uid-1", "node-a", {"gpupool.io/allocation": "{}"}))
    assert annotated["metadata"]["annotations"] == {"gpupool.io/allocation": "{}"}


async def test_list_returns_dicts_and_the_list_resource_version(fake):
    server, cluster = fake
    nodes, rv = await cluster.list_nodes()
    assert rv == "42"
    assert nodes == [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "resourceVersion": "7"}}]


async def test_pods_are_listed_across_all_namespaces(fake):
    server, cluster = fake
    pods, rv = await cluster.list_pods()
    assert rv == "9" and [p["metadata"]["name"] for p in pods] == ["p"]
    assert server.requests[-1][:2] == ("GET", "/api/v1/pods")


async def test_annotation_patch_is_a_merge_patch_with_precondition(fake):
    server, cluster = fake
    pod = await cluster.patch_pod_annotations("default", "p", {"gpupool.io/allocation": "{}"}, resource_version="1")
    assert pod["metadata"]["annotations"] == {"gpupool.io/allocation": "{}"}
    method, path, ctype, body = server.requests[-1]
    assert (method, path, ctype) == ("PATCH", "/api/v1/namespaces/default/pods/p", "application/merge-patch+json")
    assert body == {"metadata": {"annotations": {"gpupool.io/allocation": "{}"}, "resourceVersion": "1"}}
    with pytest.raises(Conflict):
        await cluster.patch_pod_annotations("default", "p", {"x": "y"}, resource_version="0")
    await cluster.patch_pod_annotations("default", "p", {"x": None})  # no precondition: none sent
    assert server.requests[-1][3] == {"metadata": {"annotations": {"x": None}}}


async def test_binding_posts_the_subresource_with_uid_and_maps_409(fake):
    server, cluster = fake
    await cluster.create_binding("default", "p", "u1", "n1")
    method, path, _, body = server.requests[-1]
    assert (method, path) == ("POST", "/api/v1/namespaces/default/pods/p/binding")
    assert body["metadata"]["uid"] == "u1" and body["target"]["name"] == "n1" and body["kind"] == "Binding"
    with pytest.raises(Conflict, match="already assigned"):
        await cluster.create_binding("default", "p", "u1", "n1")


async def test_not_found_and_delete_preconditions(fake):
    server, cluster = fake
    with pytest.raises(NotFound):
        await cluster.get_pod("default", "missing")
    await cluster.delete_pod("default", "p", uid="u1")
    method, path, _, body = server.requests[-1]
    assert (method, path) == ("DELETE", "/api/v1/namespaces/default/pods/p")
    assert body["preconditions"] == {"uid": "u1"}


async def test_from_config_uses_the_named_kubeconfig_context(fake, tmp_path):
    import yaml

    _, cluster = fake
    server_url = str(cluster.client._client.config.cluster.server)  # the recording server's URL
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server_url}},
                     {"name": "wrong", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "good", "context": {"cluster": "fake", "user": "u"}},
                     {"name": "bad", "context": {"cluster": "wrong", "user": "u"}}],
        "current-context": "bad",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    other = KubeCluster.from_config(str(path), context="good")
    try:
        nodes, rv = await other.list_nodes()
    finally:
        await other.close()
    assert rv == "42" and nodes[0]["metadata"]["name"] == "n1"


async def test_watch_streams_events_as_dicts_and_maps_410_to_gone(fake):
    server, cluster = fake
    stream = cluster.watch_pods("5")
    first = await stream.__anext__()
    second = await stream.__anext__()
    await stream.aclose()
    assert (first.type, second.type) == ("ADDED", "DELETED")
    assert first.object["metadata"]["uid"] == "u1" and isinstance(first.object, dict)
    assert server.watch_params["resourceVersion"] == "5"
    with pytest.raises(Gone):
        async for _ in cluster.watch_pods("1"):
            pass


async def test_node_labels_are_a_merge_patch(fake):
    server, cluster = fake
    node = await cluster.patch_node_labels("n1", {"gpupool.io/model": "H100-80GB", "old": None})
    method, path, ctype, body = server.requests[-1]
    assert (method, path, ctype) == ("PATCH", "/api/v1/nodes/n1", "application/merge-patch+json")
    assert body == {"metadata": {"labels": {"gpupool.io/model": "H100-80GB", "old": None}}}
    assert node["metadata"]["labels"]["gpupool.io/model"] == "H100-80GB"


async def test_selectors_become_query_parameters(fake):
    server, cluster = fake
    pods, _ = await cluster.list_pods(fields={"spec.nodeName": "gpu-node-1"}, labels={"team": "a"})
    assert server.requests[-1][:2] == ("GET", "/api/v1/pods")
    assert server.queries[-1]["fieldSelector"] == "spec.nodeName=gpu-node-1"
    assert server.queries[-1]["labelSelector"] == "team=a"


async def test_the_agent_lists_its_own_nodes_pods_only(fake):
    """Through the kube adapter the agent's pod list carries spec.nodeName: the API server (and the agent's
    RBAC audit trail) sees a node-scoped list, never a list of every pod of the cluster."""
    from gpupool.agent.port import ClusterPortAgent

    server, cluster = fake
    await ClusterPortAgent(cluster).list_pods_on_node("gpu-node-1")
    pod_lists = [q for (m, path, _, _), q in zip(server.requests, server.queries, strict=True)
                 if (m, path) == ("GET", "/api/v1/pods")]
    assert pod_lists == [{"fieldSelector": "spec.nodeName=gpu-node-1"}]


async def test_a_kind_the_server_does_not_serve_is_not_found(fake):
    from gpupool.cluster.port import Kind

    _, cluster = fake
    queues = Kind("gpupool.io", "v1alpha1", "GPUQueue", "gpuqueues", namespaced=False)
    with pytest.raises(NotFound):
        await cluster.list_objects(queues)
    with pytest.raises(NotFound):
        await cluster.get_object(queues, "q")
