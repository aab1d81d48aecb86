#!/usr/bin/env python3
"""Admission webhook latency over TLS: the time the API server waits for one AdmissionReview answer.

A child process serves the real webhook app (uvicorn, TLS, the same build_server/serve path as
`gpupool webhook`) with an inventory of 1,000 GPU nodes; the parent posts AdmissionReviews for a
realistic GPU pod to /mutate over one kept-alive HTTPS connection (as the API server reuses its
connections) and times each round trip, response parsed. Client and server share this machine's cores.
Each run sends --requests reviews after a warm-up; p50/p99 are the medians over --runs runs.

    python benchmarks/webhook_latency.py [--runs 5] [--requests 2000]

Last line: {"admit_p50_ms": x, "admit_p99_ms": y}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.webhook.helpers (throwaway CA)

from tests.webhook.helpers import gpu_node, make_tls, pod, review  # noqa: E402

NODES = 1000


def serve(cert: str, key: str, port: int) -> None:
    from gpupool.webhook.admission import Settings
    from gpupool.webhook.app import create_app
    from gpupool.webhook.inventory import InventoryView
    from gpupool.webhook.server import build_server
    from gpupool.webhook.server import serve as run

    inventory = InventoryView()
    models = [("A100-40GB", 40960), ("H100-80GB", 81920), ("L4", 23034), ("A10", 23028)]
    inventory.replace(gpu_node(f"node-{i}", *models[i % len(models)], 8) for i in range(NODES))
    app = create_app(Settings(), inventory, 3 * 1024 * 1024)
    server = build_server(app, "127.0.0.1", port, Path(cert), Path(key), "warning")
    asyncio.run(run(server, 30.0, []))


def realistic_pod() -> dict[str, Any]:
    """A training pod as a Deployment would create it: sidecar, env, volumes, probes, a GPU share."""
    obj = pod(
        {
            "cpu": "4",
            "memory": "16Gi",
            "gpupool.io/gpu": "1",
            "gpupool.io/gpu-memory": "10Gi",
            "gpupool.io/gpu-cores": "30",
        },
        annotations={"team.example.com/owner": "vision"},
    )
    main = obj["spec"]["containers"][0]
    main["env"] = [{"name": f"VAR_{i}", "value": "x" * 40} for i in range(20)]
    main["volumeMounts"] = [{"name": "data", "mountPath": "/data"}, {"name": "shm", "mountPath": "/dev/shm"}]
    main["readinessProbe"] = {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 5}
    obj["spec"]["containers"].append(
        {
            "name": "log-shipper",
            "image": "fluent/fluent-bit:3.0",
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
        }
    )
    obj["spec"]["volumes"] = [
        {"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
    ]
    obj["metadata"]["labels"] = {"app": "train", "pod-template-hash": "5d8f7c9b6"}
    obj["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": "train-5d8f7c9b6",
            "uid": "3f1c2d7e-0000-4000-8000-000000000001",
            "controller": True,
        }
    ]
    return obj


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def one_run(client: httpx.Client, body: bytes, requests: int) -> tuple[float, float]:
    for _ in range(200):  # warm-up: connection, caches
        client.post("/mutate", content=body)
    times = []
    for _ in range(requests):
        start = time.perf_counter()
        r = client.post("/mutate", content=body)
        answer = r.json()
        times.append((time.perf_counter() - start) * 1000)
        if r.status_code != 200 or not answer["response"]["allowed"]:
            raise SystemExit(f"unexpected answer: {r.status_code} {r.text[:300]}")
    times.sort()
    return percentile(times, 0.50), percentile(times, 0.99)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tls = make_tls(Path(tmp))
        port = free_port()
        child = multiprocessing.get_context("spawn").Process(target=serve, args=(str(tls.cert), str(tls.key), port))
        child.start()
        try:
            context = ssl.create_default_context(cafile=str(tls.ca))
            headers = {"content-type": "application/json"}
            with httpx.Client(
                base_url=f"https://127.0.0.1:{port}", verify=context, headers=headers, timeout=30
            ) as client:
                for _ in range(300):  # wait up to ~30 s for the child to listen
                    try:
                        client.get("/healthz")
                        break
                    except httpx.TransportError:
                        time.sleep(0.1)
                body = json.dumps(review(realistic_pod())).encode()
                load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
                print(
                    f"cores: {os.cpu_count()}  load average: {load}  python: {sys.version.split()[0]}  nodes: {NODES}"
                )
                print(f"AdmissionReview body: {len(body)} bytes; {args.requests} requests per run, {args.runs} runs")
                p50s, p99s = [], []
                for run in range(args.runs):
                    p50, p99 = one_run(client, body, args.requests)
                    p50s.append(p50)
                    p99s.append(p99)
                    print(f"run {run + 1}: p50 {p50:.3f} ms  p99 {p99:.3f} ms")
        finally:
            child.terminate()
            child.join(10)
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())} (other processes share the cores)")
    result = {"admit_p50_ms": round(statistics.median(p50s), 3), "admit_p99_ms": round(statistics.median(p99s), 3)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
