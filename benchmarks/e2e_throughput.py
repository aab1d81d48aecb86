"""GPU share pods per second scheduled by the real kube-scheduler through the gpupool extender, and the
pod-creation-to-binding latency p99, on the scripts/k8s-testbed control plane with N fake GPU nodes.

    python benchmarks/e2e_throughput.py --nodes 1000 [--pods 1000] [--runs 3] [--trivial]

Each run has two parts, each in a fresh namespace:
- throughput: with kube-scheduler stopped, `--pods` share pods are created; kube-scheduler is started and
  the backlog drains; pods/s = (pods - 1) / (last binding seen - first binding seen);
- latency: `--latency-pods` pods arrive at a steady rate (half the measured throughput unless --rate),
  latency per pod = binding seen by a watch - its create request sent (client clock); p99 over the run.
During the drain the benchmark also reads each process's CPU time (user + system, /proc/PID/stat) and
prints it per pod bound: extender, kube-scheduler (from its start), kube-apiserver, etcd, and the benchmark
itself (its pod watch and status-only kubelet). On a machine whose cores the whole control plane shares,
pods/s follows the sum, so this says where a lower figure comes from.
A status-only kubelet marks bound pods Running, which frees the node for its next GPU pod (as the agent's
Allocate would). `--trivial` runs the same with a do-nothing extender, as the machine's baseline;
`--compare` runs that baseline and then gpupool in the same invocation (each on a fresh control plane) and
adds the baseline's figures and gpupool's share of its pods/s (`vs_trivial`). The figures are the medians
over the runs. Last line: one JSON object.
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
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.harness import fleet  # noqa: E402
from tests.harness import testbed as tb  # noqa: E402


def chart_config() -> dict | None:
    """The chart's kube-scheduler configuration, when helm (scripts/k8s/build.sh) is built or can be."""
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


def start_extender(bed: tb.Testbed, policy: str | None, trivial: bool) -> tuple[subprocess.Popen[bytes], str]:
    port = tb.free_port()
    if trivial:
        argv = [sys.executable, str(ROOT / "scripts" / "k8s" / "trivial_extender.py"), "--port", str(port),
                "--server", bed.url, "--token", bed.tokens[tb.SCHEDULER_USER]]
    else:
        argv = [*tb.gpupool_argv(), "scheduler",
                "--kubeconfig", str(bed.kubeconfig(tb.SCHEDULER_USER)), "--host", "127.0.0.1", "--port", str(port),
                "--no-leader-elect", "--log-level", "warning"]  # as the chart runs it
        if policy:
            argv += ["--default-policy", policy]
    log = (bed.dir / "extender.log").open("ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=tb.die_with_parent)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"extender exited; see {bed.dir / 'extender.log'}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url
        if time.monotonic() > deadline:
            raise SystemExit("extender not ready after 120 s")
        time.sleep(0.2)


def _specs(ns: str, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [fleet.share_pod(f"p{i:05d}", ns, memory_mib=rng.choice([5120, 10240, 20480]),
                            cores=rng.choice([10, 20, 25, 30])) for i in range(n)]


class BindWatch:
    """Records when each pod of a namespace is first seen bound (client clock)."""

    def __init__(self, api: fleet.KubeApi, ns: str, expected: int) -> None:
        self.api, self.ns, self.expected = api, ns, expected
        self.bound: dict[str, float] = {}
        self.done = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        _, rv = await self.api.list_pods(self.ns)
        self.task = asyncio.create_task(self._run(rv))

    async def _run(self, rv: str) -> None:
        async for _type, obj in self.api.watch(f"/api/v1/namespaces/{self.ns}/pods", rv):
            name = obj["metadata"]["name"]
            if obj["spec"].get("nodeName") and name not in self.bound:
                self.bound[name] = time.monotonic()
                if len(self.bound) == self.expected:
                    self.done.set()
                    return

    async def wait(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.done.wait(), timeout=timeout_s)
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15


def component_pids(bed: tb.Testbed, extender: subprocess.Popen[bytes]) -> dict[str, int]:
    pids = {"extender": extender.pid, "benchmark": os.getpid()}
    for name in ("kube-scheduler", "kube-apiserver", "etcd"):
        if name in bed.processes:
            pids[name] = bed.processes[name].popen.pid
    return pids


async def throughput_run(api: fleet.KubeApi, bed: tb.Testbed, sched_config: str, run: int, pods: int,
                         seed: int, extender: subprocess.Popen[bytes]) -> tuple[float, dict[str, float]]:
    """Backlog drain: kube-scheduler is stopped while `pods` pods are created, then started; pods/s =
    (pods - 1) / (last binding - first binding). Creation speed does not enter the figure. Also returns
    each component's CPU milliseconds per pod bound, from kube-scheduler's start to the last binding."""
    ns = f"tput-{run}"
    await api.ensure_namespace(ns)
    bed.stop_scheduler()
    watch = BindWatch(api, ns, pods)
    await watch.start()
    gate = asyncio.Semaphore(32)

    async def create(p: dict) -> None:
        async with gate:
            await api.create_pod(p)

    await asyncio.gather(*(create(p) for p in _specs(ns, pods, seed + run)))
    before = {name: cpu_seconds(pid) for name, pid in component_pids(bed, extender).items()}
    bed.start_scheduler(sched_config)
    pids = component_pids(bed, extender)
    await watch.wait(max(120.0, pods * 0.5))
    used = {name: cpu_seconds(pid) - before.get(name, 0.0) for name, pid in pids.items()}
    times = sorted(watch.bound.values())
    if len(times) < pods:
        print(f"  run {run}: only {len(times)} of {pods} pods bound before the timeout", flush=True)
    per_pod = {name: round(seconds * 1000 / max(1, len(times)), 1) for name, seconds in used.items()}
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
    return rate, per_pod


async def latency_run(api: fleet.KubeApi, run: int, pods: int, rate: float, seed: int) -> list[float]:
    """Steady arrivals at `rate` pods/s; latency = binding seen by the watch - create request sent (ms)."""
    ns = f"lat-{run}"
    await api.ensure_namespace(ns)
    watch = BindWatch(api, ns, pods)
    await watch.start()
    sent: dict[str, float] = {}
    tasks = []
    t0 = time.monotonic()
    for i, p in enumerate(_specs(ns, pods, seed + 1000 + run)):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        sent[p["metadata"]["name"]] = time.monotonic()
        tasks.append(asyncio.create_task(api.create_pod(p)))
    await asyncio.gather(*tasks)
    await watch.wait(max(120.0, pods * 0.5))
    return sorted((watch.bound[n] - sent[n]) * 1000 for n in watch.bound)


def p99(values: list[float]) -> float:
    if not values:
        return float("inf")
    return values[min(len(values) - 1, max(0, int(round(0.99 * len(values))) - 1))]


def bind_outcomes(url: str) -> str:
    """The extender's bind outcomes and per-verb latency sums from its /metrics (whole benchmark)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    out = []
    for line in text.splitlines():
        if line.startswith("gpupool_binds_total{") or line.startswith("gpupool_api_conflicts_total{"):
            out.append(line.replace("_total", ""))
        elif line.startswith("gpupool_extender_request_duration_seconds_sum") or \
                line.startswith("gpupool_extender_request_duration_seconds_count"):
            out.append(line.replace("gpupool_extender_request_duration_seconds", "latency"))
    return "; ".join(out)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    bed = tb.Testbed().start()
    ext = None
    try:
        ext, url = start_extender(bed, args.policy, args.trivial)
        config = chart_config()
        print(f"kube-scheduler config: {'from the Helm chart' if config else 'built in (helm not installed)'}")
        api = fleet.KubeApi(bed.url, bed.admin_token, max_connections=64)
        try:
            t0 = time.monotonic()
            await fleet.create_nodes(api, [fleet.gpu_node(f"node-{i:05d}", gpus=4) for i in range(args.nodes)])
            took = time.monotonic() - t0
            print(f"{args.nodes} fake GPU nodes (4 x A100-80GB, 10 slots each) created in {took:.1f} s")
            sched_config = tb.scheduler_config(url, config)
            async with fleet.StatusKubelet(api) as kubelet:
                rates, p99s, cpus = [], [], []
                for run in range(1, args.runs + 1):
                    rate, cpu = await throughput_run(api, bed, sched_config, run, args.pods, args.seed, ext)
                    arrival = args.rate or max(1.0, round(rate / 2, 1))
                    lat = await latency_run(api, run, args.latency_pods, arrival, args.seed)
                    print(f"  run {run}: backlog of {args.pods} drained at {rate:.1f} pods/s; "
                          f"{len(lat)}/{args.latency_pods} pods arriving at {arrival:g}/s bound with latency "
                          f"p50 {lat[len(lat) // 2] if lat else float('inf'):.0f} ms, p99 {p99(lat):.0f} ms",
                          flush=True)
                    print(f"  run {run}: CPU ms per pod bound: "
                          + ", ".join(f"{k} {v:g}" for k, v in cpu.items()) + f"; all {sum(cpu.values()):.1f}",
                          flush=True)
                    rates.append(rate)
                    p99s.append(p99(lat))
                    cpus.append(cpu)
                if not args.trivial:
                    print(f"  extender: {bind_outcomes(url)}")
                if kubelet.failures:
                    print(f"  stand-in kubelet failures: {list(kubelet.failures.items())[:3]}")
        finally:
            await api.close()
        return {
            "kubernetes_version": bed.server_version(),
            "nodes": args.nodes,
            "pods_per_s": round(statistics.median(rates), 1),
            "p99_bind_latency_ms": round(statistics.median(p99s), 1),
            "cpu_ms_per_pod": {k: round(statistics.median(c[k] for c in cpus), 1) for k in cpus[0]},
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
    parser.add_argument("--pods", type=int, default=None, help="backlog pods per run (default: = nodes, at most 1000)")
    parser.add_argument("--latency-pods", type=int, default=200, help="pods per latency run")
    parser.add_argument("--rate", type=float, default=None,
                        help="arrival rate of the latency run, pods/s (default: half the measured throughput)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--policy", default=None, help="extender default policy (default: the scheduler's)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trivial", action="store_true",
                        help="baseline: a do-nothing extender instead of gpupool (same pods, same control plane)")
    parser.add_argument("--compare", action="store_true",
                        help="run the trivial baseline, then gpupool, and report gpupool's share of the baseline")
    args = parser.parse_args()
    args.pods = args.pods or min(args.nodes, 1000)
    result: dict[str, Any] = {}
    for trivial in ([True, False] if args.compare else [args.trivial]):
        args.trivial = trivial
        what = "trivial extender (baseline)" if trivial else "gpupool extender"
        print(f"cores: {os.cpu_count()}; {what}; nodes {args.nodes}, {args.pods} pods per run, {args.runs} runs",
              flush=True)
        figures = asyncio.run(main_async(args))
        if trivial and args.compare:
            result = {"trivial_pods_per_s": figures["pods_per_s"],
                      "trivial_p99_bind_latency_ms": figures["p99_bind_latency_ms"],
                      "trivial_cpu_ms_per_pod": figures["cpu_ms_per_pod"]}
        else:
            result = {**figures, **result}
    if args.compare and result["trivial_pods_per_s"] > 0:
        result["vs_trivial"] = round(result["pods_per_s"] / result["trivial_pods_per_s"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
