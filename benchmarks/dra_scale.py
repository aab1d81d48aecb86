"""Claims at cluster speed: gpupool's claim path against kube-scheduler's own DRA allocator on the real
Kubernetes control plane, with hundreds or thousands of nodes published as gpupool ResourceSlices.

    python benchmarks/dra_scale.py [--nodes 500,5000] [--claims 5000] [--gpus-per-node 4] [--profile DIR]

For each node count, one control plane (tests/harness/testbed.py: etcd, kube-apiserver and
kube-controller-manager 1.37, whose resourceclaim controller makes each pod's claim from its template) and
one kube-scheduler 1.37 (its own defaults: DynamicResources allocates claims; client QPS 5,000 as upstream's
scheduler_perf runs it). The nodes are API objects as gpupool's DRA agent and a kubelet leave them: the
`gpupool.io/inventory` annotation, a Ready status, and the node's ResourceSlice built by the agent's own
code (gpupool.api.dra.resource_slices: one shared device per GPU, consumable memory and cores). No kubelet:
a pod counts once it is bound (spec.nodeName), which is where both allocators' work ends.

The claims: `--claims` pods, each with one claim from a ResourceClaimTemplate of class gpu.gpupool.io, the
share drawn (seeded) from 1/8, 2/8, 4/8 and 8/8 of an 80 GiB GPU (weights 4:3:2:1; memory k x 10 GiB, cores
floor(100 k / 8)), so memory is the binding dimension. Two parts, one after the other on the same nodes,
the same pods in the same order (a part starts on empty GPUs: the previous part's pods are force-deleted
and its claims gone first):
1. kube-scheduler: plain claim pods; kube-scheduler's DRA allocator picks node and device and binds.
2. gpupool: the same pods as gpupool's webhook leaves them with `dra.placement` on (its own function,
   gpupool.webhook.admission.claims_gate, puts the scheduling gate gpu.gpupool.io/allocate on each; the
   webhook server itself is not in the path, its admission latency is benchmarks/webhook_latency.py's);
   `gpupool scheduler` (GPUPOOL_SCHEDULER_DRA_PLACEMENT=true, started after part 1) runs each claim
   through its framework's claim profile, writes the allocation and removes the gate; the same
   kube-scheduler then reserves the claim and binds the pod.
pods/s = pods bound / seconds from the first create request to the last binding seen (a pod watch in this
process, client clock). Pods are created 32 at a time, so the creation rate is a ceiling for both parts
(`<part>_created_per_s` in the JSON: a pods/s close to it measures the creation, not the allocator).
A part ends when every pod is bound or no binding came for `--stall-s` seconds (then `*_unbound` says how
many were left).

unallocated %: GPU memory left free on GPUs that hold at least one claim, as a percentage of all GPUs'
memory, once every pod is placed. That is exactly what would stay unallocated if the cluster were then
filled with whole-GPU claims, which only an empty GPU can take: capacity stranded in fragments. (The
simulator's figure, GPU capacity unallocated when arrived demand reaches 100 %, needs pods that fit
nowhere; here every pod must bind for pods/s to mean anything, so the fill is taken as whole GPUs.) The
claims' results (pool, device, consumedCapacity) are read from the API after the part.

`--profile DIR`: the gpupool scheduler runs under cProfile (DIR/gpupool-scheduler-<nodes>.prof, written
when it stops) and its top functions are printed. Each part also prints the CPU seconds each process used
(/proc), since on a small machine every component shares the same cores.
Last line: one JSON object, `runs` holding one object per node count (kubernetes_version, nodes, claims,
gpupool_pods_per_s, kube_scheduler_pods_per_s, ratio, unallocated_pct_gpupool,
unallocated_pct_kube_scheduler, ...), and `cores`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import io
import json
import os
import pstats
import random
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.e2e_throughput import cpu_seconds  # noqa: E402
from gpupool.api.dra import DRIVER, SliceDevice, resource_slices  # noqa: E402
from gpupool.api.quantity import bytes_to_mib, parse_quantity  # noqa: E402
from gpupool.webhook.admission import Settings, claims_gate  # noqa: E402
from tests.harness import fleet  # noqa: E402
from tests.harness import testbed as tb  # noqa: E402

Obj = dict[str, Any]
NAMESPACE = "dra-scale"
SCHEDULER = "dra-scale"  # kube-scheduler's profile: only it places these pods
GPU_MODEL, GPU_MIB, COMPUTE_CAPABILITY, DRIVER_VERSION = "A100-80GB", 81920, "8.0", "570.86"
EIGHTHS, WEIGHTS = (1, 2, 4, 8), (4, 3, 2, 1)
CREATE_PARALLEL = 32
RESOURCE_CLAIMS = "/apis/resource.k8s.io/v1"


# --- what is published and created (pure) ---------------------------------------------------------------

def node_name(i: int) -> str:
    return f"dra-{i:05d}"


def node_object(name: str, gpus: int) -> Obj:
    """The Node as a kubelet and gpupool's DRA agent leave it: inventory annotation, Ready, no device-plugin
    slots (its GPUs are served through DRA only)."""
    node = fleet.gpu_node(name, gpus, GPU_MODEL, GPU_MIB)
    node["status"] = fleet.node_status(None)
    return node


def slice_objects(name: str, uid: str, gpus: int) -> list[Obj]:
    """The node's ResourceSlices exactly as the agent publishes them (gpupool.api.dra.resource_slices)."""
    devices = [SliceDevice(i, f"GPU-{name}-{i}", GPU_MODEL, GPU_MIB, COMPUTE_CAPABILITY, numa_node=i * 2 // gpus)
               for i in range(gpus)]
    return resource_slices(name, uid, devices, DRIVER_VERSION, 1)


def share(eighths: int) -> tuple[int, int]:
    """(memory MiB, cores %) of a share of `eighths` eighths of a GPU."""
    return eighths * GPU_MIB // 8, 100 * eighths // 8


def template_name(eighths: int) -> str:
    return f"share-{eighths}of8"


def claim_template(eighths: int, namespace: str = NAMESPACE) -> Obj:
    memory, cores = share(eighths)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": template_name(eighths), "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER,
                "capacity": {"requests": {"memory": f"{memory}Mi", "cores": str(cores)}}}}]}}}}


def share_sizes(count: int, seed: int = 0) -> list[int]:
    """Each pod's share in eighths of a GPU, the same list for both parts."""
    rng = random.Random(seed)
    return rng.choices(EIGHTHS, weights=WEIGHTS, k=count)


def apply_patch(doc: Obj, ops: Sequence[Mapping[str, Any]]) -> Obj:
    """A copy of `doc` with JSON Patch add/replace operations applied (what the API server does with the
    webhook's answer)."""
    out = copy.deepcopy(doc)
    for op in ops:
        if op["op"] not in ("add", "replace"):
            raise ValueError(f"unexpected patch operation {op['op']}")
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in str(op["path"]).split("/")[1:]]
        parent: Any = out
        for t in tokens[:-1]:
            parent = parent[int(t)] if isinstance(parent, list) else parent[t]
        if isinstance(parent, list):
            parent.insert(len(parent) if tokens[-1] == "-" else int(tokens[-1]), copy.deepcopy(op["value"]))
        else:
            parent[tokens[-1]] = copy.deepcopy(op["value"])
    return out


def claim_pod(index: int, eighths: int, gated: bool, namespace: str = NAMESPACE) -> Obj:
    """Pod `index` with one claim from its share's template; `gated`: as gpupool's webhook leaves it with
    dra.placement on (its scheduling gate, from the webhook's own code)."""
    pod: Obj = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"claim-{index:05d}", "namespace": namespace},
                "spec": {"schedulerName": SCHEDULER, "terminationGracePeriodSeconds": 0,
                         "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name(eighths)}],
                         "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                         "resources": {"claims": [{"name": "gpu"}]}}]}}
    if gated:
        pod = apply_patch(pod, claims_gate(pod, Settings(dra_placement=True)))
    return pod


# --- what the allocators did (pure) ----------------------------------------------------------------------

def _mib(quantity: str) -> int:
    return bytes_to_mib(parse_quantity(quantity, "memory")[0], round_up=True)


def gpu_use(claims: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], int]:
    """MiB allocated per GPU (pool = node, device), from the claims' allocations: each result's consumed
    memory, or the request's when the result does not say."""
    out: dict[tuple[str, str], int] = {}
    for c in claims:
        allocation = (c.get("status") or {}).get("allocation")
        if not allocation:
            continue
        asked = {r["name"]: ((r.get("exactly") or {}).get("capacity") or {}).get("requests", {}).get("memory")
                 for r in c["spec"]["devices"]["requests"]}
        for r in allocation["devices"]["results"]:
            memory = (r.get("consumedCapacity") or {}).get("memory") or asked.get(r["request"])
            key = (str(r["pool"]), str(r["device"]))
            out[key] = out.get(key, 0) + (_mib(memory) if memory else GPU_MIB)
    return out


def unallocated_pct(use: Mapping[tuple[str, str], int], total_gpus: int, gpu_mib: int = GPU_MIB) -> float:
    """GPU memory free on GPUs that hold at least one claim, in percent of all GPUs' memory (module doc)."""
    stranded = sum(max(0, gpu_mib - used) for used in use.values() if used > 0)
    return 100.0 * stranded / (total_gpus * gpu_mib)


RESULT_KEYS = ("kubernetes_version", "nodes", "claims", "gpupool_pods_per_s", "kube_scheduler_pods_per_s", "ratio",
               "unallocated_pct_gpupool", "unallocated_pct_kube_scheduler")


def result(version: str, nodes: int, gpus_per_node: int, parts: Mapping[str, Mapping[str, Any]]) -> Obj:
    """One node count's JSON object from the parts' figures (pods_per_s, unallocated_pct, bound, ...); a
    part not run gives nulls."""
    def figure(label: str, key: str) -> float | None:
        value = (parts.get(label) or {}).get(key)
        return None if value is None else round(float(value), 2)

    gp, ks = figure("gpupool", "pods_per_s"), figure("kube_scheduler", "pods_per_s")
    out: Obj = {
        "kubernetes_version": version, "nodes": nodes,
        "claims": next(p["claims"] for p in parts.values()),
        "gpupool_pods_per_s": gp, "kube_scheduler_pods_per_s": ks,
        "ratio": round(gp / ks, 2) if gp is not None and ks else None,
        "unallocated_pct_gpupool": figure("gpupool", "unallocated_pct"),
        "unallocated_pct_kube_scheduler": figure("kube_scheduler", "unallocated_pct"),
        "gpus_per_node": gpus_per_node,
    }
    for label, part in parts.items():
        out[f"{label}_unbound"] = part["claims"] - part["bound"]
        out[f"gpus_used_{label}"] = part["gpus_used"]
        out[f"nodes_used_{label}"] = part["nodes_used"]
        out[f"{label}_created_per_s"] = round(float(part["created_per_s"]), 2)
    out["cores"] = os.cpu_count()
    return out


# --- the cluster -----------------------------------------------------------------------------------------

def kube_scheduler_config() -> str:
    """kube-scheduler's defaults (DynamicResources allocates), one profile, a client as fast as upstream's
    scheduler_perf gives it (the default 50 QPS would measure the client's rate limiter)."""
    return json.dumps({
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": "__KUBECONFIG__", "qps": 5000, "burst": 5000},
        "leaderElection": {"leaderElect": False}, "profiles": [{"schedulerName": SCHEDULER}],
    })


def device_classes(version: str) -> list[Obj]:
    """The chart's DeviceClasses with dra.enabled (rendered by the helm the testbed builds)."""
    import yaml

    from tests.deploy.helm_tool import helm_binary

    out = subprocess.run([str(helm_binary()), "template", "gpd", str(ROOT / "deploy" / "helm" / "gpupool"),
                          "--namespace", "gpupool-system", "--kube-version", version.lstrip("v"),
                          "--set", "dra.enabled=true", "--show-only", "templates/dra/deviceclasses.yaml"],
                         capture_output=True, text=True, timeout=120, check=False)
    if out.returncode != 0:
        raise SystemExit(f"helm template: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


async def publish_nodes(api: fleet.KubeApi, count: int, gpus: int) -> None:
    gate = asyncio.Semaphore(CREATE_PARALLEL)

    async def one(i: int) -> None:
        name = node_name(i)
        async with gate:
            created = await fleet.create_node(api, node_object(name, gpus))
            for s in slice_objects(name, created["metadata"]["uid"], gpus):
                await api.post(f"{RESOURCE_CLAIMS}/resourceslices", s)

    await asyncio.gather(*(one(i) for i in range(count)))


class Bindings:
    """When each pod of the namespace is first seen bound (a watch of bound pods only, client clock)."""

    def __init__(self, api: fleet.KubeApi) -> None:
        self.api = api
        self.bound: dict[str, float] = {}
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        path = f"/api/v1/namespaces/{NAMESPACE}/pods?fieldSelector=spec.nodeName!%3D"
        rv = str((await self.api.get(path + "&limit=1"))["metadata"]["resourceVersion"])

        async def run() -> None:
            nonlocal rv
            while True:
                with contextlib.suppress(httpx.HTTPError, fleet.ApiStatus):
                    async for _type, obj in self.api.watch(path, rv):
                        rv = str(obj["metadata"]["resourceVersion"])
                        name = obj["metadata"]["name"]
                        if (obj.get("spec") or {}).get("nodeName") and name not in self.bound:
                            self.bound[name] = time.monotonic()
                            self.changed.set()
                await asyncio.sleep(0.1)

        self._task = asyncio.create_task(run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def list_all(api: fleet.KubeApi, path: str) -> list[Obj]:
    items: list[Obj] = []
    token = ""
    while True:
        sep = "&" if "?" in path else "?"
        doc = await api.get(f"{path}{sep}limit=2000" + (f"&continue={token}" if token else ""))
        items += doc.get("items") or []
        token = (doc.get("metadata") or {}).get("continue") or ""
        if not token:
            return items


def pids(bed: tb.Testbed, extra: Mapping[str, subprocess.Popen[bytes]]) -> dict[str, int]:
    out = {name: p.popen.pid for name, p in bed.processes.items()}
    out.update({name: p.pid for name, p in extra.items()})
    out["benchmark"] = os.getpid()
    return out


async def part(api: fleet.KubeApi, bed: tb.Testbed, label: str, sizes: Sequence[int], gated: bool,
               stall_s: float, extra: Mapping[str, subprocess.Popen[bytes]], total_gpus: int) -> Obj:
    """Create the pods, wait for them to be bound, read the claims (the caller then `clear`s: the next part
    starts on empty GPUs)."""
    pods = [claim_pod(i, k, gated) for i, k in enumerate(sizes)]
    watch = Bindings(api)
    await watch.start()
    before = {name: cpu_seconds(pid) for name, pid in pids(bed, extra).items()}
    gate = asyncio.Semaphore(CREATE_PARALLEL)

    async def create(pod: Obj) -> None:
        async with gate:
            await api.create_pod(pod)

    start = time.monotonic()
    await asyncio.gather(*(create(p) for p in pods))
    created = time.monotonic() - start
    last = time.monotonic()
    while len(watch.bound) < len(pods):
        watch.changed.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await watch.changed.wait()
        if watch.changed.is_set():
            last = time.monotonic()
        elif time.monotonic() - last > stall_s:
            break
    await watch.stop()
    used = {name: cpu_seconds(pid) - before.get(name, 0.0) for name, pid in pids(bed, extra).items()}
    times = sorted(watch.bound.values())
    seconds = (times[-1] - start) if times else float("inf")
    claims = await list_all(api, f"{RESOURCE_CLAIMS}/namespaces/{NAMESPACE}/resourceclaims")
    use = gpu_use(claims)
    out = {"claims": len(pods), "bound": len(times), "pods_per_s": len(times) / seconds,
           "unallocated_pct": unallocated_pct(use, total_gpus), "gpus_used": sum(1 for v in use.values() if v),
           "nodes_used": len({n for (n, _), v in use.items() if v}),
           # the ceiling the creation puts on pods_per_s (pods reach an allocator no faster than this)
           "created_per_s": len(pods) / created}
    cpu = ", ".join(f"{name} {s:.0f}" for name, s in sorted(used.items(), key=lambda kv: -kv[1]) if s >= 0.5)
    print(f"  {label}: {len(times)}/{len(pods)} pods bound in {seconds:.1f} s ({out['pods_per_s']:.1f} pods/s; "
          f"pods created in {created:.1f} s); {out['gpus_used']} GPUs on {out['nodes_used']} nodes hold claims, "
          f"unallocated {out['unallocated_pct']:.2f} %", flush=True)
    print(f"  {label}: CPU seconds during the part: {cpu}", flush=True)
    return out


async def clear(api: fleet.KubeApi) -> None:
    """Every pod force-deleted; returns once the resourceclaim controller has removed every claim. (One
    collection delete of thousands of pods outlasts the API server's request timeout, which answers nothing
    but goes on deleting: asked again until none is left.)"""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, fleet.ApiStatus):
            await api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods?gracePeriodSeconds=0")
        left = await api.get(f"{RESOURCE_CLAIMS}/namespaces/{NAMESPACE}/resourceclaims?limit=1")
        pods = await api.get(f"/api/v1/namespaces/{NAMESPACE}/pods?limit=1")
        if not left.get("items") and not pods.get("items"):
            return
        await asyncio.sleep(1)
    raise SystemExit("claims still there 600 s after their pods were deleted")


def start_gpupool(bed: tb.Testbed, profile: Path | None) -> tuple[tb.Process, str]:
    port = tb.free_port()
    command = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "gpupool"] if profile else tb.gpupool_argv()
    argv = [*command, "scheduler", "--kubeconfig", str(bed.kubeconfig(tb.SCHEDULER_USER)), "--no-leader-elect",
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    proc = tb.spawn("gpupool-scheduler", argv, bed.dir / "gpupool-scheduler.log",
                    env={"GPUPOOL_SCHEDULER_DRA_PLACEMENT": "true"})
    return proc, f"http://127.0.0.1:{port}"


def wait_gpupool(proc: tb.Process, url: str, nodes: int) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if not proc.alive():
            raise SystemExit(f"gpupool scheduler exited:\n{proc.tail()}")
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            if httpx.get(url + "/readyz", timeout=5).status_code == 200 and \
                    httpx.get(url + "/debug/ledger", timeout=60).json()["ledger"]["nodes"] >= nodes:
                return
        time.sleep(1)
    raise SystemExit(f"gpupool scheduler not ready with {nodes} nodes:\n{proc.tail()}")


def show_profile(path: Path, top: int = 30) -> None:
    out = io.StringIO()
    pstats.Stats(str(path), stream=out).sort_stats("cumulative").print_stats(top)
    print(out.getvalue(), flush=True)
    out = io.StringIO()
    pstats.Stats(str(path), stream=out).sort_stats("tottime").print_stats(top)
    print(out.getvalue(), flush=True)


async def run_nodes(nodes: int, args: argparse.Namespace) -> Obj:
    bed = tb.Testbed().start()
    gp: tb.Process | None = None
    api = fleet.KubeApi(bed.url, bed.admin_token, max_connections=CREATE_PARALLEL + 8)
    try:
        version = bed.server_version()
        for c in device_classes(version):
            await api.post(f"{RESOURCE_CLAIMS}/deviceclasses", c)
        began = time.monotonic()
        await publish_nodes(api, nodes, args.gpus_per_node)
        print(f"{nodes} nodes and their ResourceSlices published in {time.monotonic() - began:.0f} s "
              f"({nodes * args.gpus_per_node} GPUs)", flush=True)
        await api.ensure_namespace(NAMESPACE)
        for k in EIGHTHS:
            await api.post(f"{RESOURCE_CLAIMS}/namespaces/{NAMESPACE}/resourceclaimtemplates", claim_template(k))
        bed.start_scheduler(kube_scheduler_config(), verbosity=1)
        sizes = share_sizes(args.claims, args.seed)
        total = nodes * args.gpus_per_node
        print(f"{args.claims} claims, demand {sum(sizes) / 8 / total * 100:.0f} % of the GPUs' memory", flush=True)
        parts: dict[str, Obj] = {}
        if not args.skip_kube_scheduler:
            parts["kube_scheduler"] = await part(api, bed, "kube-scheduler", sizes, False, args.stall_s, {}, total)
            await clear(api)
        profile = args.profile / f"gpupool-scheduler-{nodes}.prof" if args.profile else None
        gp, url = start_gpupool(bed, profile)
        began = time.monotonic()
        await asyncio.to_thread(wait_gpupool, gp, url, nodes)
        print(f"gpupool scheduler ready with {nodes} nodes in {time.monotonic() - began:.0f} s", flush=True)
        parts["gpupool"] = await part(api, bed, "gpupool", sizes, True, args.stall_s, {"gpupool": gp.popen}, total)
        gp.stop(60)  # before the pods go: a profile shows the part only
        if profile is not None and profile.exists():
            show_profile(profile)
        return result(version, nodes, args.gpus_per_node, parts)
    finally:
        if gp is not None:
            gp.stop(60)
        await api.close()
        bed.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="500", help="node counts, comma-separated (e.g. 500,5000)")
    parser.add_argument("--claims", type=int, default=5000)
    parser.add_argument("--gpus-per-node", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stall-s", type=float, default=60.0, help="end a part after this long without a binding")
    parser.add_argument("--profile", type=Path, default=None, help="run the gpupool scheduler under cProfile here")
    parser.add_argument("--skip-kube-scheduler", action="store_true",
                        help="gpupool's part only (profiling; its figures are then null)")
    args = parser.parse_args()
    try:
        counts = [int(n) for n in args.nodes.split(",")]
    except ValueError:
        parser.error("--nodes: comma-separated integers")
    if min(counts) < 1 or args.claims < 1 or not 1 <= args.gpus_per_node <= 64:
        parser.error("--nodes and --claims must be at least 1, --gpus-per-node 1 to 64")
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    print(f"cores: {os.cpu_count()}; nodes {counts}, {args.gpus_per_node} GPUs ({GPU_MODEL}) each, "
          f"{args.claims} claims", flush=True)
    runs = []
    for n in counts:
        runs.append(asyncio.run(run_nodes(n, args)))
        print(json.dumps(runs[-1]), flush=True)
    print(json.dumps({"cores": os.cpu_count(), "runs": runs}), flush=True)


if __name__ == "__main__":
    main()
