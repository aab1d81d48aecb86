"""Share pods on real nodes: time from creating N pods at once to all of them Running under real kubelets
and containerd, as a ratio to the same number of pods without GPU requests in the same run.

    python benchmarks/real_node.py [--nodes 3] [--pods 60]

One control plane (scripts/k8s-testbed), the gpupool extender with the chart's kube-scheduler
configuration, N real nodes (containerd + kubelet 1.20 each, scripts/k8s/realnode.py) with 3 fake GPUs
each and one `gpupool agent` per node. In order:
1. baseline: N pods without GPU requests (default scheduler), created with one `kubectl apply`, until all
   Running; then deleted;
2. share pods: N one-GPU shares (10 % of a GPU, 2 GiB each), spread over the nodes by nodeSelector,
   created with one `kubectl apply`, until all Running; each container's grant (its logs) compared with
   its allocation (`env_ok`);
3. re-registration: each node's kubelet restarted once; seconds from the kubelet's start to the agent's
   next successful registration (`reregister_s_max` over the nodes).
Times are taken on this process's clock by polling the API every 0.2 s. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.conftest import Extender, chart_scheduler_config  # noqa: E402
from tests.e2e.kubectl_tool import kubectl_binary  # noqa: E402
from tests.e2e.real_node_fixtures import (  # noqa: E402
    GPUS_PER_NODE,
    NAMESPACE,
    SPLIT,
    NodeAgent,
    RealCluster,
    expected_grant,
    phase,
    realnode,
    share_pod,
    wait_for,
)
from tests.harness import testbed as tb  # noqa: E402


def time_to_running(c: RealCluster, pods: list[dict]) -> float:
    names = {p["metadata"]["name"] for p in pods}
    start = time.monotonic()
    c.apply(pods)
    wait_for(lambda: sum(phase(p) == "Running" and p["metadata"]["name"] in names for p in c.pods()) == len(names),
             600, f"{len(names)} pods Running", step_s=0.2)
    return time.monotonic() - start


def clear(c: RealCluster) -> None:
    names = [p["metadata"]["name"] for p in c.pods()]
    if names:
        c.delete_pods(names)
    wait_for(lambda: not c.pods(), 300, "pods deleted")


def reregister_seconds(node: realnode.RealNode, agent: NodeAgent) -> float:
    before = agent.registrations()
    node.stop_kubelet()
    start = time.monotonic()
    node.start_kubelet()
    wait_for(lambda: agent.registrations() > before, 120, f"agent of {node.name} re-registered", step_s=0.05)
    return time.monotonic() - start


def run(args: argparse.Namespace) -> dict[str, object]:
    missing = realnode.missing_tools()
    if missing:
        raise SystemExit("real nodes need: " + "; ".join(missing))
    bed = tb.Testbed().start()
    # Token-file users named like the chart's accounts (not the chart's RBAC: see tests/e2e for that).
    ext = Extender(bed, tb.free_port(), bed.dir / "gpupool-scheduler.log", bed.kubeconfig(tb.SCHEDULER_USER))
    nodes = realnode.RealNodes(bed, args.nodes, taint=True)
    agents: list[NodeAgent] = []
    try:
        ext.start()
        ext.wait_ready()
        bed.start_scheduler(tb.scheduler_config(ext.url, chart_scheduler_config()))
        nodes.start()
        c = RealCluster(bed, ext, nodes, kubectl_path=kubectl_binary())
        bed.tenant_namespace(NAMESPACE)
        for node in nodes.nodes:
            agent = NodeAgent(node, bed.kubeconfig(tb.AGENT_USER), tb.free_port())
            agents.append(agent)
            c.agents[node.name] = agent
            agent.start()
        for i in range(args.nodes):
            wait_for(lambda i=i: c.gpu_slots(i) == GPUS_PER_NODE * SPLIT, 120, "agents registered")  # type: ignore[misc]
        names = [n.name for n in nodes.nodes]
        plain = [share_pod(f"plain-{k}", names[k % len(names)], None, None, gpus=0) for k in range(args.pods)]
        plain_s = time_to_running(c, plain)
        clear(c)
        shares = [share_pod(f"share-{k}", names[k % len(names)], 2048, 10) for k in range(args.pods)]
        share_s = time_to_running(c, shares)
        running = [p for p in c.pods() if phase(p) == "Running"]
        env_ok = sum(c.grant(p["metadata"]["name"]) == expected_grant(p) for p in running)
        clear(c)
        reregister = [reregister_seconds(n, a) for n, a in zip(nodes.nodes, agents, strict=True)]
        return {
            "kubernetes_version": bed.server_version(),
            "nodes": args.nodes, "pods": args.pods, "pods_running": len(running),
            "seconds_to_all_running": round(share_s, 2), "env_ok": env_ok == len(running) == args.pods,
            "env_ok_pods": env_ok, "reregister_s_max": round(max(reregister), 2),
            "plain_seconds_to_all_running": round(plain_s, 2), "ratio_to_plain": round(share_s / plain_s, 2),
            "cores": os.cpu_count(),
        }
    finally:
        for agent in agents:
            agent.stop()
        nodes.stop()
        ext.stop()
        bed.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--pods", type=int, default=60)
    args = parser.parse_args()
    if args.nodes < 1 or args.pods < 1:
        parser.error("--nodes and --pods must be at least 1")
    if args.pods > args.nodes * GPUS_PER_NODE * SPLIT:
        parser.error(f"--pods: at most {args.nodes * GPUS_PER_NODE * SPLIT} share pods fit {args.nodes} nodes")
    print(f"cores: {os.cpu_count()}; {args.nodes} real nodes, {args.pods} pods", flush=True)
    print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
