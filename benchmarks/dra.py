"""GPU shares through DRA claims on real nodes, against the same shares through gpupool's extender and plain
pods: pods/s from creating a batch to all Running, the agent's NodePrepareResources latency, how fast a fault
reaches the node's ResourceSlice, and (simulated) how much GPU capacity stays unallocated under each allocator.

    python benchmarks/dra.py [--nodes 3] [--pods 30] [--runs 3]

One control plane (scripts/k8s-testbed), N real nodes (containerd + kubelet 1.37 each, scripts/k8s/realnode.py)
with 3 fake L40S each. In order, each part `--runs` times, pods and claims deleted between runs:
1. plain: `--pods` pods without GPU or claims, one `kubectl apply`, a plain kube-scheduler (no extender);
2. DRA: the agent as the chart runs it with dra.enabled (`gpupool agent --dra --device-plugin-with-dra`: the
   device plugin beside the driver, the chart's default, so each prepare also checks the claim against the
   node's pods; the chart's agent identity, rules and DeviceClasses, tests/e2e/test_e2e_dra.py), the same
   plain kube-scheduler, whose DynamicResources plugin allocates the claims; `--pods` pods each with a claim
   from one ResourceClaimTemplate (2 GiB and 10 % of a GPU, class gpu.gpupool.io), one `kubectl apply`. Each
   container's grant is compared with its claim's allocation (`env_ok`). Then, for every claim of the run, the
   benchmark calls the agent's DRA socket as kubelet does, NodeUnprepareResources and then
   NodePrepareResources, and times the prepare: a full prepare (claim read from the API, hook directory and
   limits file, CDI spec, checkpoint), one at a time, so `prepare_p50_ms`/`prepare_p99_ms` are its service
   time on this machine, without the wait behind other claims that a burst adds (the agent prepares one claim
   at a time);
3. gpupool allocator: `gpupool scheduler` as its own process under the chart's scheduler identity with
   dra.enabled (release `gpd`, as in test_e2e_dra.py), the same `--pods` pods with the scheduling gate
   gpu.gpupool.io/allocate (as the webhook puts it when gpupool places claims): gpupool's ClaimAllocator
   writes each claim's allocation with gpupool's policy and removes the gate, the same plain kube-scheduler
   reserves the claim and binds the pod; grants compared as above, and every claim checked to be allocated
   by gpupool (its field manager owns status.allocation). For the first run of this part and of part 2,
   the packing outcome: GPUs holding at least one claim once the burst runs (`gpus_used_gpupool`,
   `gpus_used_dra_default`: kube-scheduler's own allocator), the nodes they are on (`nodes_used_*`), and
   whether gpupool's equals what its policy decides for the same burst replayed through the simulator's
   engine (`gpupool_packing_as_policy`);
4. the ResourceSlice: `slice_update_s`, a fault in a running agent (a node validation step failing, written
   into the fake GPU file, SIGHUP) until the node's slice carries the NoSchedule taint on its devices: the
   same path a GPU turning unhealthy takes (device table changed, slice published). The fake backend cannot
   break a GPU inside a running agent, so `slice_taint_after_restart_s` is the time from starting an agent
   whose fake file declares GPU 1 broken to the slice carrying gpu.gpupool.io/unhealthy on gpu-1 (agent
   start-up included);
5. extender: the DRA agents stopped, `gpupool agent` as device plugin (3 GPUs, 10 slots each) and the gpupool
   extender with the chart's kube-scheduler configuration; the same shares as `gpupool.io/gpu-memory: 2048`,
   `gpu-cores: 10` pods (as the webhook leaves them), one `kubectl apply`; grants compared with allocations.
pods/s = pods Running / seconds from the `kubectl apply` to all Running (this process's clock, the API polled
every 0.2 s); medians over the runs (`dra_pods_per_s`: part 2, `dra_gpupool_pods_per_s`: part 3).
`unallocated_pct_*` come from the simulator (gpupool.sim.unallocated.unallocated_pct, policies `dra-default`
and `gpupool`); null where that module is not there. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpupool.agent.proto import dra_v1_pb2 as v1  # noqa: E402
from gpupool.agent.proto import dra_v1_pb2_grpc as v1_grpc  # noqa: E402
from gpupool.api.dra import TAINT_NOT_READY, TAINT_UNHEALTHY  # noqa: E402
from tests.e2e import real_node_fixtures as rn  # noqa: E402
from tests.e2e import test_e2e_dra as dra  # noqa: E402
from tests.e2e.conftest import Extender, chart_scheduler_config  # noqa: E402
from tests.harness import testbed as tb  # noqa: E402

GPUS = rn.GPUS_PER_NODE  # as many GPUs per node on both paths
MEMORY_MIB, CORES = 2048, 10
Obj = dict[str, Any]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def batch(apply: Any, pods: list[Obj], running: Any) -> tuple[float, int]:
    """One `kubectl apply` of `pods`; seconds until all are Running, and how many are."""
    names = {p["metadata"]["name"] for p in pods}
    start = time.monotonic()
    apply(pods)
    rn.wait_for(lambda: running(names) == len(names), 600, f"{len(names)} pods Running", step_s=0.2)
    return time.monotonic() - start, running(names)


def running_in(pods: list[Obj], names: set[str]) -> int:
    return sum(rn.phase(p) == "Running" and p["metadata"]["name"] in names for p in pods)


def plain_pod(name: str) -> Obj:
    pod = dra.claim_pod(name, None)
    del pod["spec"]["resourceClaims"]
    pod["spec"]["containers"][0]["resources"] = {}
    pod["spec"]["containers"][0]["command"] = ["sh", "-c", "exec sleep 1000000"]
    return pod


def time_prepares(c: dra.DraCluster, pods: list[Obj]) -> list[float]:
    """Unprepare, then prepare again, each pod's claim over its agent's socket; the prepares' milliseconds."""
    out = []
    for pod in pods:
        got = c.pod_claim(pod)
        namespace, name, uid = dra.NAMESPACE, got["metadata"]["name"], got["metadata"]["uid"]
        socket = c.agent_of(pod).service_socket
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            stub = v1_grpc.DRAPluginStub(channel)
            claims = [v1.Claim(namespace=namespace, name=name, uid=uid)]
            gone = stub.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(claims=claims), timeout=30)
            assert not gone.claims[uid].error, gone.claims[uid].error
            start = time.perf_counter()
            answer = stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=claims), timeout=30)
            out.append((time.perf_counter() - start) * 1000)
            assert not answer.claims[uid].error and answer.claims[uid].devices, answer.claims[uid]
    return out


def taints(c: dra.DraCluster, i: int) -> dict[str, list[str]]:
    s = c.slice(i) or {"spec": {"devices": []}}
    return {d["name"]: [t["key"] for t in d.get("taints") or []] for d in s["spec"]["devices"]}


def slice_after_fault(c: dra.DraCluster) -> float:
    """A validation fault in node 0's running agent (SIGHUP: re-validate now) until every device of its slice
    carries the not-validated taint; then fixed the same way (not timed)."""
    agent = c.agents[0]
    assert agent.proc is not None
    doc = json.loads(agent.fake_file.read_text())
    took = []
    for fault, key in (({"toolkit": "toolkit broken by the benchmark"}, [TAINT_NOT_READY]), ({}, [])):
        agent.fake_file.write_text(json.dumps({**doc, "validation": fault}))
        start = time.monotonic()
        os.kill(agent.proc.pid, signal.SIGHUP)
        want = {f"gpu-{k}": key for k in range(agent.gpus)}
        rn.wait_for(lambda want=want: taints(c, 0) == want, 120, "the slice's taints", step_s=0.02)  # type: ignore[misc]
        took.append(time.monotonic() - start)
    return took[0]


def slice_after_restart(c: dra.DraCluster) -> float:
    """Node 0's agent started with GPU 1 broken, until the slice's gpu-1 carries the unhealthy taint; then
    started healthy again (not timed)."""
    agent = c.agents[0]
    agent.stop()
    start = time.monotonic()
    agent.start(broken=(1,))
    rn.wait_for(lambda: TAINT_UNHEALTHY in taints(c, 0).get("gpu-1", []), 120, "gpu-1 tainted", step_s=0.02)
    took = time.monotonic() - start
    agent.stop()
    agent.start()
    rn.wait_for(lambda: taints(c, 0) == {f"gpu-{k}": [] for k in range(agent.gpus)}, 120, "node 0 untainted")
    return took


def dra_part(bed: tb.Testbed, args: argparse.Namespace) -> dict[str, Any]:
    c = dra.start_dra_cluster(bed, args.nodes, gpus=GPUS)
    try:
        def running(names: set[str]) -> int:
            return running_in(c.pods(), names)

        plain, rates, prepares, env_ok, claims_running = [], [], [], True, 0
        for run in range(1, args.runs + 1):
            seconds, n = batch(c.apply, [plain_pod(f"plain-{run}-{k}") for k in range(args.pods)], running)
            plain.append(n / seconds)
            print(f"  plain run {run}: {n} pods Running in {seconds:.2f} s ({n / seconds:.2f} pods/s)", flush=True)
            c.clear()
        for run in range(1, args.runs + 1):
            template = dra.claim_template(f"share-{run}", memory=f"{MEMORY_MIB}Mi", cores=str(CORES))
            pods = [dra.claim_pod(f"dra-{run}-{k}", None, template=f"share-{run}") for k in range(args.pods)]
            seconds, n = batch(lambda objs, t=template: c.apply([t, *objs]), pods, running)  # type: ignore[misc]
            rates.append(n / seconds)
            claims_running += n
            ran = [p for p in c.pods() if rn.phase(p) == "Running"]
            ok = sum(c.grant(p["metadata"]["name"]) == dra.expected_grant(c, c.pod_claim(p)) for p in ran)
            env_ok = env_ok and ok == len(ran) == args.pods
            if run == 1:
                held_dra_default = dra.gpus_held(c, ran)
                print(f"  DRA run 1 packing (kube-scheduler's allocator): {dra.shown_counts(held_dra_default)}",
                      flush=True)
            took = time_prepares(c, ran)
            prepares += took
            print(f"  DRA run {run}: {n} pods Running in {seconds:.2f} s ({n / seconds:.2f} pods/s), {ok} grants "
                  f"as allocated; prepare p50 {percentile(took, 0.5):.1f} ms, max {max(took):.1f} ms", flush=True)
            c.clear()
        first = gpupool_part(c, args)
        fault = [slice_after_fault(c) for _ in range(args.runs)]
        restart = [slice_after_restart(c) for _ in range(args.runs)]
        print(f"  slice: fault to taint {', '.join(f'{s:.2f}' for s in fault)} s; agent start with a broken GPU to "
              f"taint {', '.join(f'{s:.2f}' for s in restart)} s", flush=True)
        return {"plain": plain, "dra": rates, "prepares": prepares, "env_ok": env_ok and first["env_ok"],
                "claims_running": claims_running + first["claims_running"], "fault": fault, "restart": restart,
                "cluster": c, "gpupool": first["rates"], "held_dra_default": held_dra_default,
                "held_gpupool": first["held"], "as_policy": first["as_policy"]}
    except BaseException:
        dra.stop_dra_cluster(c)
        raise


def gpupool_part(c: dra.DraCluster, args: argparse.Namespace) -> dict[str, Any]:
    """Part 3: the same bursts, gated, allocated by gpupool's scheduler (its own process, the chart's
    scheduler identity with dra.enabled), bound by the same plain kube-scheduler."""
    bed = c.bed
    kubeconfig = bed.service_account_kubeconfig(dra.RELEASE_NAMESPACE, dra.SCHEDULER_ACCOUNT)
    ext = Extender(bed, tb.free_port(), bed.dir / "gpupool-scheduler-dra.log", kubeconfig,
                   env={"GPUPOOL_SCHEDULER_DRA_PLACEMENT": "true"})  # as the chart sets it with dra.placement
    try:
        ext.start()
        ext.wait_ready()
        rn.wait_for(lambda: ext.ledger()["ledger"]["nodes"] >= len(c.agents), 120, "the DRA nodes in the ledger")

        def running(names: set[str]) -> int:
            return running_in(c.pods(), names)

        rates, env_ok, claims_running = [], True, 0
        held: Any = None
        as_policy = False
        for run in range(1, args.runs + 1):
            # the replay reads the empty cluster: computed before the burst, as the allocator starts from it
            want = dra.replay(c, "gpupool", args.pods, MEMORY_MIB, CORES,
                              workload=dra.allocator_workload(ext)) if run == 1 else None
            template = dra.claim_template(f"gp-share-{run}", memory=f"{MEMORY_MIB}Mi", cores=str(CORES))
            pods = [dra.gated_pod(f"gp-{run}-{k}", template=f"gp-share-{run}") for k in range(args.pods)]
            seconds, n = batch(lambda objs, t=template: c.apply([t, *objs]), pods, running)  # type: ignore[misc]
            rates.append(n / seconds)
            claims_running += n
            ran = [p for p in c.pods() if rn.phase(p) == "Running"]
            ok = sum(c.grant(p["metadata"]["name"]) == dra.expected_grant(c, c.pod_claim(p))
                     and dra.allocation_writers(c.pod_claim(p)) == {dra.MANAGER} for p in ran)
            env_ok = env_ok and ok == len(ran) == args.pods
            if run == 1:
                held = dra.gpus_held(c, ran)
                as_policy = held == want
                print(f"  gpupool run 1 packing: {dra.shown_counts(held)} "
                      f"({'as' if as_policy else 'NOT as'} the policy's replay)", flush=True)
            print(f"  gpupool run {run}: {n} pods Running in {seconds:.2f} s ({n / seconds:.2f} pods/s), {ok} grants "
                  "as allocated by gpupool", flush=True)
            c.clear()
            # the next burst's replay starts from empty GPUs: so must the allocator's ledger
            rn.wait_for(lambda: ext.ledger()["ledger"]["entries"] == [], 120, "an empty ledger")
        return {"rates": rates, "env_ok": env_ok, "claims_running": claims_running, "held": held,
                "as_policy": as_policy}
    finally:
        ext.stop()


def extender_part(bed: tb.Testbed, c: dra.DraCluster, args: argparse.Namespace) -> tuple[list[float], bool]:
    """The DRA agents give way to device-plugin agents and gpupool's extender on the same nodes."""
    for dra_agent in c.agents:
        dra_agent.stop()
    ext = Extender(bed, tb.free_port(), bed.dir / "gpupool-scheduler.log", bed.kubeconfig(tb.SCHEDULER_USER))
    agents: list[rn.NodeAgent] = []
    try:
        ext.start()
        ext.wait_ready()
        bed.start_scheduler(tb.scheduler_config(ext.url, chart_scheduler_config()))
        cluster = rn.RealCluster(bed, ext, c.nodes, kubectl_path=c.kubectl_path)
        bed.tenant_namespace(rn.NAMESPACE)
        for node in c.nodes.nodes:
            plugin = rn.NodeAgent(node, bed.kubeconfig(tb.AGENT_USER), tb.free_port())
            agents.append(plugin)
            cluster.agents[node.name] = plugin
            plugin.start()
        for i in range(len(c.nodes.nodes)):
            rn.wait_for(lambda i=i: cluster.gpu_slots(i) == GPUS * rn.SPLIT, 120, "device plugins registered")  # type: ignore[misc]

        def running(names: set[str]) -> int:
            return running_in(cluster.pods(), names)

        rates, env_ok = [], True
        for run in range(1, args.runs + 1):
            pods = []
            for k in range(args.pods):
                pod = rn.share_pod(f"ext-{run}-{k}", "", MEMORY_MIB, CORES)
                del pod["spec"]["nodeSelector"]  # kube-scheduler and the extender choose, as for the claims
                pods.append(pod)
            seconds, n = batch(cluster.apply, pods, running)
            rates.append(n / seconds)
            ran = [p for p in cluster.pods() if rn.phase(p) == "Running"]
            ok = sum(cluster.grant(p["metadata"]["name"]) == rn.expected_grant(p) for p in ran)
            env_ok = env_ok and ok == len(ran) == args.pods
            print(f"  extender run {run}: {n} pods Running in {seconds:.2f} s ({n / seconds:.2f} pods/s), {ok} grants "
                  "as allocated", flush=True)
            names = [p["metadata"]["name"] for p in cluster.pods()]
            cluster.delete_pods(names)
            rn.wait_for(lambda: not cluster.pods(), 300, "pods deleted")
        return rates, env_ok
    finally:
        for plugin in agents:
            plugin.stop()
            plugin.quit_mps_daemons()
        bed.stop_scheduler()
        ext.stop()


def unallocated() -> tuple[float | None, float | None]:
    try:
        from gpupool.sim.unallocated import unallocated_pct  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        print("  unallocated_pct: gpupool.sim.unallocated is not there (null)", flush=True)
        return None, None
    return round(unallocated_pct("dra-default"), 2), round(unallocated_pct("gpupool"), 2)


def run(args: argparse.Namespace) -> dict[str, Any]:
    missing = rn.realnode.missing_tools()
    if missing:
        raise SystemExit("real nodes need: " + "; ".join(missing))
    load_start = os.getloadavg()[0]
    bed = tb.Testbed().start()
    c: dra.DraCluster | None = None
    try:
        got = dra_part(bed, args)
        c = got["cluster"]
        assert c is not None
        ext_rates, ext_env_ok = extender_part(bed, c, args)
        prepares = got["prepares"]
        print(f"  prepare over {len(prepares)} claims: p50 {percentile(prepares, 0.5):.1f} ms, "
              f"p99 {percentile(prepares, 0.99):.1f} ms", flush=True)
        return {
            "kubernetes_version": bed.server_version(),
            "nodes": args.nodes, "gpus_per_node": GPUS, "claims": 2 * args.pods * args.runs,
            "claims_running": got["claims_running"], "env_ok": bool(got["env_ok"] and ext_env_ok),
            "dra_pods_per_s": round(statistics.median(got["dra"]), 2),
            "dra_gpupool_pods_per_s": round(statistics.median(got["gpupool"]), 2),
            "extender_pods_per_s": round(statistics.median(ext_rates), 2),
            "plain_pods_per_s": round(statistics.median(got["plain"]), 2),
            "prepare_p50_ms": round(percentile(prepares, 0.5), 1),
            "prepare_p99_ms": round(percentile(prepares, 0.99), 1),
            "slice_update_s": round(statistics.median(got["fault"]), 2),
            "slice_taint_after_restart_s": round(statistics.median(got["restart"]), 2),
            "gpus_used_dra_default": len(got["held_dra_default"]), "gpus_used_gpupool": len(got["held_gpupool"]),
            # whole nodes left free matter as much to the next multi-GPU pod as GPUs
            "nodes_used_dra_default": len({n for n, _ in got["held_dra_default"]}),
            "nodes_used_gpupool": len({n for n, _ in got["held_gpupool"]}),
            "gpupool_packing_as_policy": got["as_policy"],
            "runs": args.runs, "cores": os.cpu_count(),
            # the machine's 1-minute load at the start and the end: the figures above are only comparable
            # between runs on an equally loaded machine
            "load_1m": [round(load_start, 1), round(os.getloadavg()[0], 1)],
        }
    finally:
        if c is not None:
            dra.stop_dra_cluster(c)
        bed.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--pods", type=int, default=30, help="pods per batch")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.nodes < 1 or args.pods < 1 or args.runs < 1:
        parser.error("--nodes, --pods and --runs must be at least 1")
    if args.pods > args.nodes * GPUS * rn.SPLIT:
        parser.error(f"--pods: at most {args.nodes * GPUS * rn.SPLIT} shares of {CORES} % fit {args.nodes} nodes")
    print(f"cores: {os.cpu_count()}; {args.nodes} real nodes with {GPUS} fake GPUs, {args.pods} pods per batch, "
          f"{args.runs} runs", flush=True)
    result = run(args)
    # after the testbed is gone: the simulator's replays take the cores
    result["unallocated_pct_dra_default"], result["unallocated_pct_gpupool"] = unallocated()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
