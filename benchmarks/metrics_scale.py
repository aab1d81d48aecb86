"""Scrape time and series count of the pool exporter, and dashboard render time, at cluster scale.

Builds 1,000 nodes x 8 GPUs holding 20,000 pods (2-3 sharers per GPU) plus 500 pending pods, serves
/metrics and the dashboard from one real uvicorn server on 127.0.0.1 (as the scheduler would), and times
HTTP requests from a client in this process: each scrape and each page builds a fresh snapshot, so the
figures include that. `page_render_ms` is the default page (the first 100 nodes; a search reaches the
rest), `full_page_render_ms` the page with all nodes (`?all=1`). Medians of several runs. The last line
is one JSON object.

    python benchmarks/metrics_scale.py [--nodes 1000] [--pods 20000] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import threading
import time
from typing import Any

import httpx
import uvicorn
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette

from gpupool.api.snapshot import build_snapshot
from gpupool.core.model import GPU, Allocation, GPUGrant, GPURequest, Node, PodRequest
from gpupool.core.state import ClusterState
from gpupool.dashboard import create_dashboard
from gpupool.exporter import PoolCollector, metrics_route

GPUS_PER_NODE = 8
GPU_MIB = 81920


def build_pool(nodes: int, pods: int, seed: int = 1) -> ClusterState:
    state = ClusterState(
        Node(f"gpu-node-{i:04d}", 128000, 1024000,
             tuple(GPU(f"GPU-{i:04d}-{j}", j, "A100-SXM4-80GB", GPU_MIB) for j in range(GPUS_PER_NODE)))
        for i in range(nodes)
    )
    rng = random.Random(seed)
    total_gpus = nodes * GPUS_PER_NODE
    for k in range(pods):
        g = k % total_gpus
        i, j = divmod(g, GPUS_PER_NODE)
        milli = rng.choice((100, 200, 250, 300))
        if state.gpu_milli_free[i, j] < milli:
            continue
        key = f"team-{k % 40}/job-{k}"
        mem = GPU_MIB * milli // 1000
        grant = GPUGrant(state.nodes[i].gpus[j].uuid, j, milli, mem)
        if state.allocate(PodRequest(key, gpu=GPURequest(1, milli, mem)), Allocation(key, state.nodes[i].name,
                                                                                      (grant,))) is not None:
            raise RuntimeError(f"could not place {key}")
    return state


def serve(app: Any) -> tuple[str, uvicorn.Server, threading.Thread]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread


def timed_get(client: httpx.Client, url: str, runs: int) -> tuple[float, httpx.Response]:
    times = []
    r = client.get(url)  # warm-up (template compilation, first-import costs)
    for _ in range(runs):
        start = time.perf_counter()
        r = client.get(url)
        times.append(time.perf_counter() - start)
        r.raise_for_status()
    return statistics.median(times), r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=20000)
    ap.add_argument("--pending", type=int, default=500)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print(f"cores: {os.cpu_count()}  nodes: {args.nodes} x {GPUS_PER_NODE} GPUs  pods: {args.pods}  runs: {args.runs}")

    t0 = time.perf_counter()
    state = build_pool(args.nodes, args.pods)
    pending = {f"team-{k % 40}/waiting-{k}": "needs 1 x a whole free GPU; 0 available" for k in range(args.pending)}
    print(f"pool built in {time.perf_counter() - t0:.2f} s: {len(state.held)} pods hold shares")

    builds = []
    for _ in range(args.runs):
        start = time.perf_counter()
        snap = build_snapshot(state, pending)
        builds.append(time.perf_counter() - start)
    build_ms = 1000 * statistics.median(builds)
    print(f"build_snapshot: {build_ms:.0f} ms (median)  allocated {100 * snap.totals.allocated_share:.1f} %  "
          f"fragmented {100 * snap.totals.fragmented_share:.1f} %")

    pool = PoolCollector(lambda: build_snapshot(state, pending))
    app = Starlette(routes=[metrics_route(CollectorRegistry(), pool=pool)])
    app.mount("/ui", create_dashboard(lambda: build_snapshot(state, pending), cache_s=0))  # time every build
    url, server, thread = serve(app)
    try:
        with httpx.Client(timeout=300) as client:
            scrape_s, r = timed_get(client, f"{url}/metrics", args.runs)
            series = sum(len(f.samples) for f in text_string_to_metric_families(r.text))
            print(f"scrape: {scrape_s:.3f} s (median)  {series} series  {len(r.content) / 1e6:.1f} MB")
            page_s, page = timed_get(client, f"{url}/ui/", args.runs)
            print(f"dashboard page (first 100 nodes): {1000 * page_s:.0f} ms (median)  "
                  f"{len(page.content) / 1e6:.2f} MB")
            full_s, full = timed_get(client, f"{url}/ui/?all=1", args.runs)
            print(f"dashboard page (all nodes): {1000 * full_s:.0f} ms (median)  {len(full.content) / 1e6:.1f} MB")
            search_s, _ = timed_get(client, f"{url}/ui/fragment?q=job-1234", args.runs)
            print(f"dashboard search fragment: {1000 * search_s:.0f} ms (median)")
            json_s, doc = timed_get(client, f"{url}/ui/api/snapshot", args.runs)
            print(f"snapshot JSON: {1000 * json_s:.0f} ms (median)  {len(doc.content) / 1e6:.1f} MB")
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    print(json.dumps({
        "scrape_s": round(scrape_s, 3),
        "series": series,
        "page_render_ms": round(1000 * page_s, 1),
        "full_page_render_ms": round(1000 * full_s, 1),
        "search_render_ms": round(1000 * search_s, 1),
        "snapshot_json_ms": round(1000 * json_s, 1),
        "build_snapshot_ms": round(build_ms, 1),
        "nodes": args.nodes,
        "gpus": args.nodes * GPUS_PER_NODE,
        "pods": len(state.held),
        "cores": os.cpu_count(),
    }))


if __name__ == "__main__":
    main()
