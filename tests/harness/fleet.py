"""Fake GPU nodes, share pods and a status-only kubelet on a real API server (the testbed's), over raw REST.

Used by the e2e tests and benchmarks/e2e_throughput.py. Needs the project's
virtualenv (httpx, gpupool.api).

Nodes are plain API objects: this module writes what a kubelet and the gpupool agent would write (status
capacity/allocatable with `gpupool.io/gpu` slots, a Ready condition, the `gpupool.io/inventory`
annotation). `StatusKubelet` plays the part of kubelets for pods bound to those nodes: it marks each bound
pod Running (after an optional per-pod hook, e.g. a device-plugin Allocate through the real agent).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx

from gpupool.api.inventory import encode_inventory
from gpupool.api.names import ANN_INVENTORY, RESOURCE_CORES, RESOURCE_GPU, RESOURCE_MEMORY
from gpupool.core.model import GPU

Obj = dict[str, Any]
MERGE = "application/merge-patch+json"
GPU_NODE_LABEL = "gpupool.io/gpu-node"


class ApiStatus(Exception):
    """A non-2xx answer of the API server: HTTP code, Kubernetes reason and message."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"HTTP {code} {reason}: {message}")
        self.code, self.reason, self.message = code, reason, message


class KubeApi:
    """A minimal async REST client (bearer token, loopback self-signed certificate)."""

    def __init__(self, url: str, token: str, max_connections: int = 64) -> None:
        self.http = httpx.AsyncClient(
            base_url=url,
            headers={"Authorization": f"Bearer {token}"},
            verify=False,  # the testbed's self-signed serving certificate on 127.0.0.1
            timeout=httpx.Timeout(60.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def close(self) -> None:
        await self.http.aclose()

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Obj:
        content = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type} if content is not None else {}
        r = await self.http.request(method, path, content=content, headers=headers)
        if r.status_code >= 400:
            try:
                status = r.json()
            except ValueError:
                status = {"message": r.text}
            raise ApiStatus(r.status_code, str(status.get("reason", "")), str(status.get("message", r.text)))
        return r.json() if r.content else {}

    async def get(self, path: str) -> Obj:
        return await self.request("GET", path)

    async def post(self, path: str, body: Obj) -> Obj:
        return await self.request("POST", path, body)

    async def patch(self, path: str, body: Obj) -> Obj:
        return await self.request("PATCH", path, body, MERGE)

    async def delete(self, path: str) -> Obj:
        return await self.request("DELETE", path)

    async def watch(self, path: str, resource_version: str) -> AsyncIterator[tuple[str, Obj]]:
        """(type, object) events of a watch from `resource_version` (ends when the server closes it)."""
        sep = "&" if "?" in path else "?"
        url = f"{path}{sep}watch=true&resourceVersion={resource_version}&allowWatchBookmarks=false"
        async with self.http.stream("GET", url, timeout=httpx.Timeout(None, connect=10.0)) as r:
            if r.status_code >= 400:
                raise ApiStatus(r.status_code, "", (await r.aread()).decode(errors="replace"))
            async for line in r.aiter_lines():
                if line:
                    event = json.loads(line)
                    yield event["type"], event["object"]

    # --- conveniences -----------------------------------------------------------------------------
    async def ensure_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        wanted = dict(labels or {})
        try:
            await self.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": name, "labels": wanted}})
        except ApiStatus as e:
            if e.code != 409:
                raise
            await self.patch(f"/api/v1/namespaces/{name}", {"metadata": {"labels": wanted}})

    async def create_pod(self, pod: Obj) -> Obj:
        ns = pod["metadata"].get("namespace", "default")
        return await self.post(f"/api/v1/namespaces/{ns}/pods", pod)

    async def list_pods(self, namespace: str | None = None, selector: str | None = None) -> tuple[list[Obj], str]:
        path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        if selector:
            path += f"?labelSelector={selector}"
        doc = await self.get(path)
        return list(doc.get("items") or []), str(doc["metadata"]["resourceVersion"])

    async def list_nodes(self, selector: str | None = None) -> list[Obj]:
        path = "/api/v1/nodes" + (f"?labelSelector={selector}" if selector else "")
        return list((await self.get(path)).get("items") or [])


# --- nodes --------------------------------------------------------------------------------------------

def fake_gpus(node: str, count: int, model: str, memory_mib: int) -> list[GPU]:
    return [
        GPU(uuid=f"GPU-{node}-{i}", index=i, model=model, memory_mib=memory_mib, sm_count=108,
            numa_node=i * 2 // max(count, 1), nvlink_peers=())
        for i in range(count)
    ]


def node_status(slots: int | None, cpu: str = "64", memory: str = "512Gi", ready: bool = True) -> Obj:
    """What a kubelet reports: capacity = allocatable (with `slots` gpupool.io/gpu device-plugin slots)."""
    resources = {"cpu": cpu, "memory": memory, "pods": "250"}
    if slots is not None:
        resources[RESOURCE_GPU] = str(slots)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "capacity": dict(resources),
        "allocatable": dict(resources),
        "conditions": [{"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady",
                        "message": "stand-in kubelet", "lastHeartbeatTime": now, "lastTransitionTime": now}],
    }


def gpu_node(name: str, gpus: int = 4, model: str = "A100-80GB", memory_mib: int = 81920, split: int = 10,
             labels: dict[str, str] | None = None, inventory: bool = True) -> Obj:
    """A Node object as the agent and kubelet would leave it (inventory annotation, GPU slots)."""
    annotations = {}
    if inventory:
        annotations[ANN_INVENTORY] = encode_inventory(name, fake_gpus(name, gpus, model, memory_mib), split,
                                                      driver="570.86", cuda="12.8")
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, GPU_NODE_LABEL: "true",
                                               **(labels or {})}, "annotations": annotations},
        "status": node_status(gpus * split if inventory else None),
    }


async def create_node(api: KubeApi, node: Obj) -> Obj:
    """Create the node and write its status (the status subresource is the kubelet's part). The API
    server's TaintNodesByCondition admission gives every new node the node.kubernetes.io/not-ready taint;
    the node-lifecycle controller (not running here) removes it once the node is Ready: done here."""
    name = node["metadata"]["name"]
    created = await api.post("/api/v1/nodes", node)
    if node.get("status"):
        created = await api.patch(f"/api/v1/nodes/{name}/status", {"status": node["status"]})
    wanted = (node.get("spec") or {}).get("taints")
    if (created.get("spec") or {}).get("taints") != wanted:
        created = await api.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": wanted}})
    return created


async def create_nodes(api: KubeApi, nodes: list[Obj], parallel: int = 32) -> None:
    gate = asyncio.Semaphore(parallel)

    async def one(n: Obj) -> None:
        async with gate:
            await create_node(api, n)

    await asyncio.gather(*(one(n) for n in nodes))


# --- pods ---------------------------------------------------------------------------------------------

def share_pod(name: str, namespace: str = "default", memory_mib: int | None = 10240, cores: int | None = 25,
              gpus: int = 1, scheduler: str = "gpupool-scheduler", labels: dict[str, str] | None = None,
              annotations: dict[str, str] | None = None, node_selector: dict[str, str] | None = None) -> Obj:
    """A GPU share pod as it looks after the webhook (routed to gpupool, memory in MiB)."""
    limits = {RESOURCE_GPU: str(gpus)}
    if memory_mib is not None:
        limits[RESOURCE_MEMORY] = str(memory_mib)
    if cores is not None:
        limits[RESOURCE_CORES] = str(cores)
    return plain_pod(name, namespace, scheduler, labels, annotations, node_selector, limits)


def plain_pod(name: str, namespace: str = "default", scheduler: str = "default-scheduler",
              labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
              node_selector: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> Obj:
    spec: Obj = {
        "schedulerName": scheduler,
        "terminationGracePeriodSeconds": 0,
        "containers": [{
            "name": "main",
            "image": "registry.invalid/gpupool/e2e:never-pulled",
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": dict(limits or {})},
        }],
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {}),
                     "annotations": dict(annotations or {})},
        "spec": spec,
    }


# --- kubelets -----------------------------------------------------------------------------------------

PodHook = Callable[[Obj], Awaitable[None]]


class StatusKubelet:
    """For every pod bound to one of `nodes` (all nodes when None) and still Pending: run `hook(pod)` (if
    any; an exception leaves the pod Pending and is recorded in `failures`), then set phase Running.

    A Running pod is what tells the gpupool scheduler that the pod's device allocation happened, so the
    node may take the next GPU pod (gpupool.scheduler.busy)."""

    def __init__(self, api: KubeApi, nodes: set[str] | None = None, hook: PodHook | None = None,
                 namespace: str | None = None) -> None:
        self.api = api
        self.nodes = nodes
        self.hook = hook
        self.namespace = namespace
        self.started: dict[str, str] = {}  # pod uid -> node
        self.failures: dict[str, str] = {}  # pod key -> error
        self._task: asyncio.Task[None] | None = None
        self._inflight: set[str] = set()
        self._workers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> StatusKubelet:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for w in list(self._workers):
            w.cancel()
        for w in list(self._workers):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await w

    def _wants(self, pod: Obj) -> bool:
        node = (pod.get("spec") or {}).get("nodeName")
        meta = pod["metadata"]
        return bool(node) and (self.nodes is None or node in self.nodes) and not meta.get("deletionTimestamp") \
            and (pod.get("status") or {}).get("phase", "Pending") == "Pending" and meta["uid"] not in self.started \
            and meta["uid"] not in self._inflight

    def _consider(self, pod: Obj) -> None:
        if self._wants(pod):
            self._inflight.add(pod["metadata"]["uid"])
            task = asyncio.create_task(self._start(pod))
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)

    async def _start(self, pod: Obj) -> None:
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        try:
            if self.hook is not None:
                await self.hook(pod)
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            await self.api.patch(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status", {
                "metadata": {"uid": meta["uid"]},
                "status": {"phase": "Running", "startTime": now, "hostIP": "127.0.0.1", "podIP": "127.0.0.2",
                           "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]},
            })
            self.started[meta["uid"]] = pod["spec"]["nodeName"]
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.failures[key] = str(e)
        finally:
            self._inflight.discard(meta["uid"])

    async def _run(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods" if self.namespace else "/api/v1/pods"
        while True:
            pods, rv = await self.api.list_pods(self.namespace)
            for p in pods:
                self._consider(p)
            try:
                async for type_, obj in self.api.watch(path, rv):
                    if type_ in ("ADDED", "MODIFIED"):
                        self._consider(obj)
            except (ApiStatus, httpx.HTTPError):
                await asyncio.sleep(0.2)  # expired or broken watch: list again
