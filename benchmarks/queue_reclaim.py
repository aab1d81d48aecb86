"""Seconds from a queue owner's submit to its pods running, after another queue flooded the cluster by
borrowing the owner's idle guarantee: reclaim through the real kube-scheduler, the gpupool extender and the
Eviction API, on the scripts/k8s-testbed control plane with fake GPU nodes.

    python benchmarks/queue_reclaim.py [--nodes 4] [--gpus 4] [--owner-pods 4] [--trials 7] [--squeeze]

Two queues (GPUQueue objects), each guaranteed half of the GPUs. Each trial: queue `flood` fills every GPU
with whole-GPU pods (half of them borrowed), then queue `owner` submits `--owner-pods` whole-GPU pods; the
time is from the owner's first create to the last of its pods bound (a status-only kubelet marks bound pods
Running, as the agent's Allocate would). Victims have a 0 s termination grace period, so the figure is
the time beyond the victims' grace period. Then everything is deleted for the next trial. Prints the
median and the maximum over the trials (a handful of trials has no p99: the slowest one is reported as
what it is) with every trial's time and the machine's core count; last line one JSON object.

--squeeze: time-sharing instead of eviction. The queues are guaranteed half of the GPUs' compute
(gpuCores); the flood is one 80 % / 8 GiB `hook` share per GPU (marked served by an agent, as Allocate
would), the owner's pods 30 % / 8 GiB shares: each owner pod makes room by squeezing one flood pod from 80
to 70 % (nothing is evicted; "victims" in the JSON counts evictions, "squeezed" the flood pods squeezed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.e2e_throughput import chart_config, start_extender  # noqa: E402
from gpupool.api.names import ANN_ALLOCATED  # noqa: E402
from gpupool.api.queue import LABEL_QUEUE  # noqa: E402
from gpupool.api.squeeze import ANN_SQUEEZED  # noqa: E402
from tests.harness import fleet  # noqa: E402
from tests.harness import testbed as tb  # noqa: E402

CRD = ROOT / "deploy" / "helm" / "gpupool" / "crds" / "gpuqueues.yaml"
QUEUES = ("flood", "owner")


def whole(name: str, ns: str) -> dict:
    return fleet.share_pod(name, ns, memory_mib=None, cores=100, gpus=1, node_selector={"bench/group": "reclaim"})


def share(name: str, ns: str, cores: int) -> dict:
    return fleet.share_pod(name, ns, memory_mib=8192, cores=cores, gpus=1, node_selector={"bench/group": "reclaim"})


async def mark_served(api: fleet.KubeApi, ns: str) -> None:
    """What the agent's Allocate leaves on a pod: only served pods may be squeezed."""
    pods, _ = await api.list_pods(ns)
    for p in pods:
        if ANN_ALLOCATED not in (p["metadata"].get("annotations") or {}):
            await api.patch(f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}",
                            {"metadata": {"annotations": {ANN_ALLOCATED: "2026-01-01T00:00:00Z"}}})


async def squeezed(api: fleet.KubeApi, ns: str) -> int:
    pods, _ = await api.list_pods(ns)
    return sum(1 for p in pods if ANN_SQUEEZED in (p["metadata"].get("annotations") or {}))


async def bound(api: fleet.KubeApi, ns: str) -> int:
    pods, _ = await api.list_pods(ns)
    return sum(1 for p in pods if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp"))


async def wait_for(check, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def trial(api: fleet.KubeApi, n: int, total: int, owner_pods: int, squeeze: bool) -> tuple[float, int, int]:
    """Seconds to the owner's pods bound, flood pods evicted, flood pods squeezed."""
    for i in range(total):
        await api.create_pod(share(f"flood-{n}-{i}", "flood", 80) if squeeze else whole(f"flood-{n}-{i}", "flood"))
    await wait_for(lambda: _eq(bound(api, "flood"), total), 300, "the flood to bind")
    if squeeze:
        await mark_served(api, "flood")
        await asyncio.sleep(1.0)  # the extender's pod cache sees them served
    start = time.monotonic()
    for i in range(owner_pods):
        await api.create_pod(share(f"owner-{n}-{i}", "owner", 30) if squeeze else whole(f"owner-{n}-{i}", "owner"))
    await wait_for(lambda: _eq(bound(api, "owner"), owner_pods), 300, "the owner's pods to bind")
    took = time.monotonic() - start
    evicted = total - await bound(api, "flood")
    squeezes = await squeezed(api, "flood")
    for ns in QUEUES:
        pods, _ = await api.list_pods(ns)
        for p in pods:
            with contextlib.suppress(fleet.ApiStatus):
                await api.delete(f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}")
    await wait_for(lambda: _all_gone(api), 120, "the pods to go")
    return took, evicted, squeezes


async def _eq(count, expected: int) -> bool:  # type: ignore[no-untyped-def]
    return await count == expected


async def _all_gone(api: fleet.KubeApi) -> bool:
    for ns in QUEUES:
        if (await api.list_pods(ns))[0]:
            return False
    return True


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    bed = tb.Testbed().start()
    ext = None
    try:
        bed.ensure("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", yaml.safe_load(CRD.read_text()))
        ext, url = start_extender(bed, None, trivial=False)
        api = fleet.KubeApi(bed.url, bed.admin_token)
        try:
            nodes = [fleet.gpu_node(f"reclaim-{i}", gpus=args.gpus, labels={"bench/group": "reclaim"})
                     for i in range(args.nodes)]
            await fleet.create_nodes(api, nodes)
            total = args.nodes * args.gpus
            half = f"{total / 2:g}"
            for q in QUEUES:
                await api.ensure_namespace(q, labels={LABEL_QUEUE: q})
                guaranteed = {"gpuCores": total * 50} if args.squeeze else {"gpus": half}
                await api.post("/apis/gpupool.io/v1alpha1/gpuqueues", {
                    "apiVersion": "gpupool.io/v1alpha1", "kind": "GPUQueue", "metadata": {"name": q},
                    "spec": {"guaranteed": guaranteed}})
            bed.start_scheduler(tb.scheduler_config(url, chart_config()))
            await asyncio.sleep(2.0)  # the extender's queue cache follows the new objects
            times: list[float] = []
            evictions = squeezes = 0
            async with fleet.StatusKubelet(api, nodes={n["metadata"]["name"] for n in nodes}):
                for n in range(args.trials):
                    took, evicted, sq = await trial(api, n, total, args.owner_pods, args.squeeze)
                    times.append(took)
                    evictions, squeezes = evictions + evicted, squeezes + sq
                    print(f"  trial {n + 1}: {args.owner_pods} owner pods running {took:.2f} s after submit "
                          f"({evicted} flood pods evicted, {sq} squeezed)", flush=True)
        finally:
            await api.close()
        return {"kubernetes_version": bed.server_version(),
                "reclaim_p50_s": round(statistics.median(times), 2), "reclaim_max_s": round(max(times), 2),
                "reclaim_s": [round(t, 2) for t in times],
                "trials": args.trials, "nodes": args.nodes, "gpus": total, "owner_pods": args.owner_pods,
                "victim_grace_period_s": 0, "mode": "squeeze" if args.squeeze else "evict",
                "victims": evictions, "squeezed": squeezes, "cores": os.cpu_count() or 0}
    finally:
        if ext is not None:
            ext.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                ext.wait(15)
        bed.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=4, help="GPUs per node")
    parser.add_argument("--owner-pods", type=int, default=4)
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--squeeze", action="store_true", help="shares squeezed instead of whole GPUs evicted")
    args = parser.parse_args()
    if args.owner_pods > args.nodes * args.gpus // 2:
        parser.error("--owner-pods must be at most the owner's guarantee (half of the GPUs)")
    print(f"cores: {os.cpu_count()}; {args.nodes} nodes x {args.gpus} GPUs, two queues guaranteed half each; "
          f"{args.owner_pods} owner pods per trial, {args.trials} trials", flush=True)
    print(json.dumps(asyncio.run(main_async(args))))


if __name__ == "__main__":
    main()
