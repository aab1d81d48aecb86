"""Latency of the extender's /filter, /prioritize and /bind over real HTTP with nodeCacheCapable bodies.

The extender (embedded cluster + uvicorn on 127.0.0.1) runs in a child process; it is first filled with one
pod per node through the fake kube-scheduler (its /bind latencies are recorded there). The child then creates
the probe pod in the cluster (the extender decides from its own watch cache, so a pod it cannot find is
refused), and the parent sends /filter with every node name and /prioritize with the feasible ones for it, one
request at a time on a keep-alive connection, as kube-scheduler does.

The clock runs from the request's first byte sent to the answer's last byte received, on a plain HTTP/1.1
keep-alive connection (asyncio streams); the answer is decoded and checked after the clock stops. The
extender's latency is what is measured, not a Python HTTP client's: httpx spent about 6 ms of each 5,000-node
call in its own parsing, which kube-scheduler's Go client does not. The child keeps its heap frozen as
`gpupool scheduler` does (gpupool.scheduler.heap), so that the collector's full passes walk only new objects.

Usage: python benchmarks/extender_latency.py --nodes 5000 [--requests 300] [--runs 3]
Last line: {"nodes": N, "filter_p50_ms", "filter_p99_ms", "prioritize_p99_ms", "bind_p99_ms"}
(median over runs)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing as mp
import os
import statistics
import time
from typing import Any

import numpy as np


def _serve(nodes: int, conn: Any) -> None:
    from gpupool.scheduler.heap import keep_frozen
    from gpupool.testing.embedded import load_scenario, start_embedded, workload_pods
    from gpupool.testing.kube_scheduler import KubeSchedulerDriver

    logging.basicConfig(level=logging.ERROR)

    async def main() -> None:
        scenario = load_scenario().scaled(nodes)
        emb = await start_embedded(scenario)
        keep_frozen()  # as `gpupool scheduler` does once its caches are synced (gpupool.scheduler.heap)
        driver = KubeSchedulerDriver(emb.url, emb.cluster, emb.node_names, seed=1)
        stats = await driver.run(workload_pods(scenario, nodes))
        probe = await emb.cluster.create_pod(_pod())
        conn.send({"url": emb.url, "names": emb.node_names, "bind_s": driver.bind_seconds, "bound": stats.bound,
                   "probe": probe})
        await driver.close()
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # wait for "stop"
        await emb.stop()

    asyncio.run(main())


def _pod() -> dict:
    from gpupool.testing.embedded import PodShape, pod_object

    return pod_object("probe", "bench", PodShape(weight=1, gpu=1, cores=30, memory_mib=8192))


class _Connection:
    """One keep-alive HTTP/1.1 connection: POST a body, read the answer's bytes (Content-Length framed, as
    the extender answers)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, url: str) -> _Connection:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        return cls(*await asyncio.open_connection(host, int(port)))

    async def post(self, path: str, body: bytes) -> bytes:
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await self.writer.drain()
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        if not head[0].startswith("HTTP/1.1 200"):
            raise SystemExit(f"POST {path} answered {head[0]!r}")
        fields = dict(line.split(":", 1) for line in head[1:] if ":" in line)
        length = next((v for k, v in fields.items() if k.lower() == "content-length"), None)
        if length is None:
            raise SystemExit(f"POST {path}: answer without Content-Length")
        return await self.reader.readexactly(int(length))

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def _measure(url: str, names: list[str], probe: dict, requests: int) -> tuple[list[float], list[float]]:
    client = await _Connection.open(url)
    pod = json.dumps(probe).encode()
    all_names = json.dumps(names).encode()
    filter_body = b'{"Pod":' + pod + b',"Nodes":null,"NodeNames":' + all_names + b"}"
    f_ms, p_ms = [], []
    for _ in range(requests):
        t = time.perf_counter()
        answer = await client.post("/filter", filter_body)
        f_ms.append((time.perf_counter() - t) * 1000)
        result = json.loads(answer)
        if result.get("Error") or not result.get("NodeNames"):  # measure decisions, not refusals
            why = result.get("Error") or result.get("FailedAndUnresolvableNodes")
            raise SystemExit(f"the probe pod was refused: {why}")
        feasible = json.dumps(result["NodeNames"]).encode()
        body = b'{"Pod":' + pod + b',"Nodes":null,"NodeNames":' + feasible + b"}"
        t = time.perf_counter()
        answer = await client.post("/prioritize", body)
        p_ms.append((time.perf_counter() - t) * 1000)
        if not json.loads(answer):
            raise SystemExit("prioritize scored no node for the probe pod")
    await client.close()
    return f_ms, p_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"cpu cores: {os.cpu_count()}; nodes={args.nodes} requests={args.requests} runs={args.runs}")
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(args.nodes, child), daemon=True)
    proc.start()
    info = parent.recv()
    print(f"extender at {info['url']}: {len(info['names'])} nodes, {info['bound']} pods bound while filling")
    bind_p99 = float(np.percentile(np.array(info["bind_s"]) * 1000, 99)) if info["bind_s"] else float("nan")
    runs = []
    for i in range(args.runs):
        f_ms, p_ms = asyncio.run(_measure(info["url"], info["names"], info["probe"], args.requests))
        run = {
            "filter_p50_ms": float(np.percentile(f_ms, 50)),
            "filter_p99_ms": float(np.percentile(f_ms, 99)),
            "prioritize_p50_ms": float(np.percentile(p_ms, 50)),
            "prioritize_p99_ms": float(np.percentile(p_ms, 99)),
        }
        runs.append(run)
        print(f"run {i + 1}: " + ", ".join(f"{k}={v:.2f}" for k, v in run.items()))
    parent.send("stop")
    proc.join(timeout=30)
    result = {"nodes": args.nodes}
    for key in ("filter_p50_ms", "filter_p99_ms", "prioritize_p99_ms"):
        result[key] = round(statistics.median(r[key] for r in runs), 2)
    result["bind_p99_ms"] = round(bind_p99, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
