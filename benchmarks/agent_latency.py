#!/usr/bin/env python3
"""Node agent figures: Allocate latency, re-registration time after a kubelet restart, resident memory.

The real agent (fake GPU backend, embedded cluster) serves a stand-in kubelet over unix sockets:
- Allocate latency: the scheduler's bind writes (allocation + binding) happen outside the timed region; the
  timed region is kubelet's Allocate RPC alone (node-scoped pod list, identification, limits, checkpoint
  write with fsync, marker included; the Node object is neither read nor written). `--other-pods` pods on
  other nodes sit in the cluster (the agent lists its own node's pods only, so they should not show).
- Repeat latency: kubelet asking again with the same device IDs (the answer comes from the checkpoint).
- Re-registration: from the moment the restarted kubelet's socket exists until Register arrives (the
  agent polls kubelet.sock every watch_interval_s, default 0.2 s).
- RSS: a separate process running only the agent (8 fake GPUs, split 10), after it registered.
Each figure is the median of several runs. Last line: one JSON object.

    python benchmarks/agent_latency.py [--runs 5] [--allocations 300] [--restarts 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # before grpc loads: keep its info lines off the output

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.fake import FakeBackend, parse_fake_description
from gpupool.agent.port import ClusterPortAgent
from gpupool.agent.service import Agent
from gpupool.api.allocation import AllocationDoc, GrantDoc
from gpupool.api.names import ANN_ALLOCATION, RESOURCE_GPU
from gpupool.cluster.memory import MemoryCluster
from tests.harness.kubelet import StandInKubelet

NODE = "bench-node"
GPUS = 8
SPLIT = 10


def description() -> dict[str, object]:
    return {"gpus": [{"count": GPUS, "uuid_prefix": "GPU-bench", "model": "H100-80GB", "memory_mib": 81559}]}


async def start(directory: Path) -> tuple[MemoryCluster, StandInKubelet, Agent]:
    cluster = MemoryCluster()
    await cluster.create_node({"metadata": {"name": NODE}, "status": {"allocatable": {"cpu": "64", "memory": "512Gi"}}})
    config = AgentConfig(
        node_name=NODE, backend="fake", fake_file=directory / "unused.yaml", split=SPLIT, device_plugin_dir=directory
    )
    kubelet = StandInKubelet(directory)
    await kubelet.start()
    agent = Agent(config, FakeBackend(parse_fake_description(description(), "bench")), ClusterPortAgent(cluster))
    await agent.start()
    await kubelet.wait_for(lambda k: RESOURCE_GPU in k.plugins and k.plugins[RESOURCE_GPU].updates > 0)
    return cluster, kubelet, agent


async def bind(cluster: MemoryCluster, i: int) -> None:
    name = f"p{i}"
    pod = await cluster.create_pod(
        {
            "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{i}"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {RESOURCE_GPU: "1"}}}]},
        }
    )
    uid = pod["metadata"]["uid"]
    doc = AllocationDoc(
        pod_uid=uid, node=NODE, gpus=[GrantDoc(uuid=f"GPU-bench-{i % GPUS}", index=i % GPUS, memory_mib=4096, cores=10)]
    )
    await cluster.patch_pod_annotations("bench", name, {ANN_ALLOCATION: doc.model_dump_json()})
    await cluster.create_binding("bench", name, uid, NODE)


async def allocate_latencies(n: int, other_pods: int) -> tuple[list[float], list[float]]:
    """(first Allocate ms, repeated Allocate ms) per pod."""
    directory = Path(tempfile.mkdtemp(prefix="gpb-", dir="/tmp"))
    cluster, kubelet, agent = await start(directory)
    for j in range(other_pods):
        await cluster.create_pod({
            "metadata": {"name": f"elsewhere-{j}", "namespace": "bench"},
            "spec": {"nodeName": f"other-{j % 100}", "containers": [{"name": "c"}]},
            "status": {"phase": "Running"},
        })
    first: list[float] = []
    again: list[float] = []
    try:
        for i in range(n + 20):  # 20 warm-up calls
            await bind(cluster, i)
            slot = f"GPU-bench-{i % GPUS}::{(i // GPUS) % SPLIT}"
            t0 = time.perf_counter()
            resp = await kubelet.allocate_ids(RESOURCE_GPU, [slot])
            t1 = time.perf_counter()
            repeat = await kubelet.allocate_ids(RESOURCE_GPU, [slot])
            t2 = time.perf_counter()
            assert resp.envs["GPUPOOL_MEMORY_LIMIT_MIB"] == "4096" and repeat == resp
            await cluster.patch_pod_status("bench", f"p{i}", {"phase": "Running"})
            await cluster.delete_pod("bench", f"p{i}")  # keep the pod list at steady state
            if i >= 20:
                first.append((t1 - t0) * 1000)
                again.append((t2 - t1) * 1000)
    finally:
        await agent.stop()
        await kubelet.stop()
        shutil.rmtree(directory, ignore_errors=True)
    return first, again


def registered(n: int) -> Callable[[StandInKubelet], bool]:
    return lambda k: len(k.registrations) == n


async def reregister_times(restarts: int) -> list[float]:
    directory = Path(tempfile.mkdtemp(prefix="gpb-", dir="/tmp"))
    _, kubelet, agent = await start(directory)
    out: list[float] = []
    try:
        for i in range(restarts):
            await kubelet.restart()  # returns once the new kubelet.sock is being served
            t0 = time.perf_counter()
            await kubelet.wait_for(registered(i + 2), timeout=30)  # registrations so far, this one included
            out.append(time.perf_counter() - t0)
    finally:
        await agent.stop()
        await kubelet.stop()
        shutil.rmtree(directory, ignore_errors=True)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def rss_of_agent_process() -> float:
    """Start the agent alone in a child process; return its VmRSS in MiB once it has registered."""
    directory = Path(tempfile.mkdtemp(prefix="gpb-", dir="/tmp"))

    async def run() -> float:
        kubelet = StandInKubelet(directory)
        await kubelet.start()
        child = subprocess.Popen(
            [sys.executable, __file__, "--child", str(directory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            await kubelet.wait_for(
                lambda k: RESOURCE_GPU in k.plugins and k.plugins[RESOURCE_GPU].updates > 0, timeout=60
            )
            await asyncio.sleep(1.0)  # let start-up garbage settle
            status = Path(f"/proc/{child.pid}/status").read_text()
            rss_kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
            return rss_kib / 1024
        finally:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(timeout=30)
            await kubelet.stop()

    try:
        return asyncio.run(run())
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def child(directory: Path) -> None:
    async def run() -> None:
        cluster = MemoryCluster()
        await cluster.create_node({"metadata": {"name": NODE}})
        config = AgentConfig(
            node_name=NODE,
            backend="fake",
            fake_file=directory / "unused.yaml",
            split=SPLIT,
            device_plugin_dir=directory,
        )
        agent = Agent(config, FakeBackend(parse_fake_description(description(), "bench")), ClusterPortAgent(cluster))
        await agent.start()
        await asyncio.to_thread(sys.stdin.read)  # until the parent closes our stdin
        await agent.stop()

    asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--allocations", type=int, default=300)
    parser.add_argument("--restarts", type=int, default=10)
    parser.add_argument("--other-pods", type=int, default=2000, help="pods on other nodes in the cluster")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # keep stdout's last line the JSON figures
    if args.child is not None:
        child(args.child)
        return
    print(f"cores: {os.cpu_count()}  python: {sys.version.split()[0]}  runs: {args.runs}  "
          f"pods on other nodes: {args.other_pods}")
    p50s, p99s, rereg, rss, repeat_p50s = [], [], [], [], []
    for run in range(args.runs):
        lat, repeats = asyncio.run(allocate_latencies(args.allocations, args.other_pods))
        repeat_p50s.append(statistics.median(repeats))
        times = asyncio.run(reregister_times(args.restarts))
        p50s.append(statistics.median(lat))
        p99s.append(percentile(lat, 0.99))
        rereg.append(statistics.median(times))
        rss.append(rss_of_agent_process())
        print(
            f"run {run}: allocate p50 {p50s[-1]:.3f} ms p99 {p99s[-1]:.3f} ms (n={len(lat)}), "
            f"repeat p50 {repeat_p50s[-1]:.3f} ms; "
            f"re-register median {rereg[-1]:.3f} s max {max(times):.3f} s (n={len(times)}); rss {rss[-1]:.1f} MiB"
        )
    result = {
        "allocate_p50_ms": round(statistics.median(p50s), 3),
        "allocate_p99_ms": round(statistics.median(p99s), 3),
        "repeat_p50_ms": round(statistics.median(repeat_p50s), 3),
        "reregister_s": round(statistics.median(rereg), 3),
        "rss_mib": round(statistics.median(rss), 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
