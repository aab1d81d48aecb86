"""Latency of the extender's /filter, /prioritize and /bind over real HTTP with nodeCacheCapable bodies.

The extender (embedded cluster + uvicorn on 127.0.0.1) runs in a child process; it is first filled with one
pod per node through the fake kube-scheduler (its /bind latencies are recorded there). The child then creates
two probe pods in the cluster (the extender decides from its own watch cache, so a pod it cannot find is
refused), and the parent sends, one request at a time on a keep-alive connection as kube-scheduler does:
- /filter with every node name for the probe with a soft preference (a `ScheduleAnyway` topology spread):
  the answer lists the feasible nodes (`filter`), then /prioritize with them (`prioritize`);
- /filter with every node name for the probe without one: the extender decides its node there, in one
  call that replaces filter and prioritize (`decide`; docs/scheduler.md, *Filter decides*).

The same run also times a do-nothing server (`floor`: the same uvicorn transport, reading each body and
answering with the extender's own answer for the probe, precomputed), one request after each extender
request, so that the machine's speed at that moment shows beside the figure: this VM's speed changes
two- to threefold within an hour. `filter_p99_vs_floor` is the extender's filter p99 over the floor's.

The clock runs from the request's first byte sent to the answer's last byte received, on a plain HTTP/1.1
keep-alive connection (asyncio streams); the answer is decoded and checked after the clock stops. The
extender's latency is what is measured, not a Python HTTP client's: httpx spent about 6 ms of each 5,000-node
call in its own parsing, which kube-scheduler's Go client does not. The child keeps its heap frozen as
`gpupool scheduler` does (gpupool.scheduler.heap), so that the collector's full passes walk only new objects.

Usage: python benchmarks/extender_latency.py --nodes 5000 [--requests 300] [--runs 3]
Last line: {"nodes": N, "filter_p50_ms", "filter_p99_ms", "prioritize_p99_ms", "decide_p50_ms",
"decide_p99_ms", "floor_filter_p99_ms", "floor_prioritize_p99_ms", "floor_decide_p99_ms",
"filter_p99_vs_floor", "bind_p99_ms"} (medians over runs)
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
    from gpupool.demo.embedded import load_scenario, start_embedded, workload_pods
    from gpupool.demo.kube_scheduler import KubeSchedulerDriver
    from gpupool.scheduler.heap import keep_frozen
    from gpupool.scheduler.server import serve_in_background

    logging.basicConfig(level=logging.ERROR)

    async def main() -> None:
        scenario = load_scenario().scaled(nodes)
        emb = await start_embedded(scenario)
        keep_frozen()  # as `gpupool scheduler` does once its caches are synced (gpupool.scheduler.heap)
        driver = KubeSchedulerDriver(emb.url, emb.cluster, emb.node_names, seed=1)
        stats = await driver.run(workload_pods(scenario, nodes))
        probes = {"soft": await emb.cluster.create_pod(_pod("probe-soft", soft=True)),
                  "plain": await emb.cluster.create_pod(_pod("probe", soft=False))}
        await driver.close()
        keep_frozen()  # again, now that the cache holds the pods too: the measured calls start from a fresh freeze
        floor = await serve_in_background(await _floor_app(emb, probes))
        conn.send({"url": emb.url, "floor": floor.url, "names": emb.node_names, "bind_s": driver.bind_seconds,
                   "bound": stats.bound, "probes": probes})
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # wait for "stop"
        await floor.stop()
        await emb.stop()

    asyncio.run(main())


def _bodies(probe: dict, names: list[str]) -> bytes:
    return b'{"Pod":' + json.dumps(probe).encode() + b',"Nodes":null,"NodeNames":' + json.dumps(names).encode() + b"}"


async def _floor_app(emb: Any, probes: dict[str, dict]) -> Any:
    """A server that does nothing but read the body and answer what the extender answers for the probes
    (`/decide`: the plain probe's /filter)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from gpupool.api.extender import dump_priorities, parse_args

    filtered = await emb.service.filter(parse_args(_bodies(probes["soft"], emb.node_names)))
    decided = await emb.service.filter(parse_args(_bodies(probes["plain"], emb.node_names)))
    answers = {"/filter": filtered.model_dump_json().encode(),
               "/prioritize": dump_priorities(await emb.service.prioritize(
                   parse_args(_bodies(probes["soft"], filtered.NodeNames or [])))),
               "/decide": decided.model_dump_json().encode()}

    async def answer(request: Request) -> Response:
        await request.body()
        return Response(answers[request.url.path], media_type="application/json")

    return Starlette(routes=[Route(path, answer, methods=["POST"]) for path in answers])


def _pod(name: str, soft: bool) -> dict:
    from gpupool.demo.embedded import PodShape, pod_object

    pod = pod_object(name, "bench", PodShape(weight=1, gpu=1, cores=30, memory_mib=8192))
    if soft:
        pod["spec"]["topologySpreadConstraints"] = [{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app": "probe"}}}]
    return pod


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


async def _measure(url: str, floor_url: str, names: list[str], probes: dict[str, dict], requests: int
                   ) -> dict[str, list[float]]:
    """Filter then prioritize (soft probe), and the deciding filter (plain probe), on the extender, each
    followed by the same request to the floor."""
    client, floor = await _Connection.open(url), await _Connection.open(floor_url)
    filter_body, decide_body = _bodies(probes["soft"], names), _bodies(probes["plain"], names)
    ms: dict[str, list[float]] = {k: [] for k in ("filter", "prioritize", "decide", "floor_filter",
                                                  "floor_prioritize", "floor_decide")}

    async def timed(what: str, path: str, body: bytes) -> bytes:
        t = time.perf_counter()
        answer = await client.post(path, body)
        ms[what].append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        await floor.post("/decide" if what == "decide" else path, body)
        ms[f"floor_{what}"].append((time.perf_counter() - t) * 1000)
        return answer

    def nodes(answer: bytes, want: int | None) -> list[str]:
        result = json.loads(answer)
        if result.get("Error") or not result.get("NodeNames"):  # measure decisions, not refusals
            why = result.get("Error") or result.get("FailedAndUnresolvableNodes")
            raise SystemExit(f"the probe pod was refused: {why}")
        if want is not None and len(result["NodeNames"]) != want:
            raise SystemExit(f"the deciding filter answered {len(result['NodeNames'])} nodes")
        return list(result["NodeNames"])

    for _ in range(requests):
        feasible = nodes(await timed("filter", "/filter", filter_body), None)
        if not json.loads(await timed("prioritize", "/prioritize", _bodies(probes["soft"], feasible))):
            raise SystemExit("prioritize scored no node for the probe pod")
        nodes(await timed("decide", "/filter", decide_body), 1)
    await client.close()
    await floor.close()
    return ms


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
        ms = asyncio.run(_measure(info["url"], info["floor"], info["names"], info["probes"], args.requests))
        run = {f"{what}_p{q}_ms": float(np.percentile(ms[what], q)) for what in ms for q in (50, 99)}
        runs.append(run)
        print(f"run {i + 1}: " + ", ".join(f"{k}={v:.2f}" for k, v in run.items()))
    parent.send("stop")
    proc.join(timeout=30)
    result: dict[str, float] = {"nodes": args.nodes}
    for key in ("filter_p50_ms", "filter_p99_ms", "prioritize_p99_ms", "decide_p50_ms", "decide_p99_ms",
                "floor_filter_p99_ms", "floor_prioritize_p99_ms", "floor_decide_p99_ms"):
        result[key] = round(statistics.median(r[key] for r in runs), 2)
    result["filter_p99_vs_floor"] = round(result["filter_p99_ms"] / result["floor_filter_p99_ms"], 2)
    result["bind_p99_ms"] = round(bind_p99, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
