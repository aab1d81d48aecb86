"""A trivial kube-scheduler extender for the e2e benchmark's baseline: /filter keeps every node, /prioritize
scores 0, /bind posts the Binding. It shows what the real control plane reaches on this machine with an
extender that does no work, to set the gpupool figure against.

    python scripts/k8s/trivial_extender.py --port P --server https://127.0.0.1:N --token T
"""

from __future__ import annotations

import argparse
import json

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


def create_app(server: str, token: str) -> Starlette:
    api = httpx.AsyncClient(base_url=server, headers={"Authorization": f"Bearer {token}"}, verify=False,
                            limits=httpx.Limits(max_connections=32))

    async def filter_(request: Request) -> Response:
        args = json.loads(await request.body())
        return Response(json.dumps({"NodeNames": args.get("NodeNames") or [], "FailedNodes": {}, "Error": ""}),
                        media_type="application/json")

    async def prioritize(request: Request) -> Response:
        args = json.loads(await request.body())
        return Response(json.dumps([{"Host": n, "Score": 0} for n in args.get("NodeNames") or []]),
                        media_type="application/json")

    async def bind(request: Request) -> Response:
        a = json.loads(await request.body())
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": a["PodName"], "namespace": a["PodNamespace"], "uid": a["PodUID"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": a["Node"]}}
        r = await api.post(f"/api/v1/namespaces/{a['PodNamespace']}/pods/{a['PodName']}/binding", json=body)
        error = "" if r.status_code < 300 else f"HTTP {r.status_code}: {r.text[:200]}"
        return Response(json.dumps({"Error": error}), media_type="application/json")

    async def healthz(request: Request) -> Response:
        return Response("ok")

    return Starlette(routes=[Route("/filter", filter_, methods=["POST"]),
                             Route("/prioritize", prioritize, methods=["POST"]),
                             Route("/bind", bind, methods=["POST"]), Route("/readyz", healthz)])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--token", required=True)
    a = parser.parse_args()
    uvicorn.run(create_app(a.server, a.token), host="127.0.0.1", port=a.port, log_level="warning", access_log=False)
