"""Node validation through a real kubelet: seconds from a validation fault to the node's GPUs withdrawn, and
from its fix to the GPUs advertised again.

    python benchmarks/validation.py [--runs 5]

One control plane (scripts/k8s-testbed), one real node (containerd + kubelet 1.37) with 3 fake GPUs and one
`gpupool agent` run as the e2e suite runs it. Each run writes a fault into the agent's fake GPU file (a
step of the validation failing, cycling through driver, toolkit, isolation and workload) and sends SIGHUP
(re-validate now, docs/agent.md); `withdraw_s` is the time until the node's allocatable gpupool.io/gpu is
0 as the API server shows it (the agent marks the slots Unhealthy, kubelet updates the node). Then the fault
is removed and SIGHUP sent again; `readvertise_s` is the time until every slot is allocatable again.
Times are on this process's clock, polling the API every 0.05 s; medians and maxima over the runs. Last
line: one JSON object.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.conftest import Extender  # noqa: E402
from tests.e2e.kubectl_tool import kubectl_binary  # noqa: E402
from tests.e2e.real_node_fixtures import GPUS_PER_NODE, SPLIT, NodeAgent, RealCluster, realnode, wait_for  # noqa: E402
from tests.harness import testbed as tb  # noqa: E402

STEPS = ("driver", "toolkit", "isolation", "workload")


def inject(agent: NodeAgent, step: str | None) -> float:
    """Write the fault (or its fix) into the agent's fake file, SIGHUP it; returns when it was sent."""
    doc: dict[str, Any] = json.loads(agent.fake_file.read_text())
    doc["validation"] = {step: f"{step} broken by the benchmark"} if step else {}
    agent.fake_file.write_text(json.dumps(doc))
    assert agent.proc is not None
    start = time.monotonic()
    os.kill(agent.proc.pid, signal.SIGHUP)
    return start


def run(args: argparse.Namespace) -> dict[str, object]:
    missing = realnode.missing_tools()
    if missing:
        raise SystemExit("real nodes need: " + "; ".join(missing))
    bed = tb.Testbed().start()
    ext = Extender(bed, tb.free_port(), bed.dir / "gpupool-scheduler.log", bed.kubeconfig(tb.SCHEDULER_USER))
    nodes = realnode.RealNodes(bed, 1, taint=True)
    agent: NodeAgent | None = None
    try:
        ext.start()
        ext.wait_ready()
        nodes.start()
        c = RealCluster(bed, ext, nodes, kubectl_path=kubectl_binary())
        agent = NodeAgent(nodes.nodes[0], bed.kubeconfig(tb.AGENT_USER), tb.free_port())
        c.agents[nodes.nodes[0].name] = agent
        agent.start()
        full = GPUS_PER_NODE * SPLIT
        wait_for(lambda: c.gpu_slots(0) == full, 120, "the agent's slots")
        withdraw, readvertise = [], []
        for k in range(args.runs):
            step = STEPS[k % len(STEPS)]
            start = inject(agent, step)
            wait_for(lambda: c.gpu_slots(0) == 0, 120, f"slots withdrawn after a {step} fault", step_s=0.05)
            withdraw.append(time.monotonic() - start)
            start = inject(agent, None)
            wait_for(lambda: c.gpu_slots(0) == full, 120, f"slots back after the {step} fix", step_s=0.05)
            readvertise.append(time.monotonic() - start)
            print(f"  run {k + 1} ({step}): withdrawn in {withdraw[-1]:.2f} s, back in {readvertise[-1]:.2f} s",
                  flush=True)
        return {
            "kubernetes_version": bed.server_version(), "runs": args.runs,
            "withdraw_s": round(statistics.median(withdraw), 2), "withdraw_s_max": round(max(withdraw), 2),
            "readvertise_s": round(statistics.median(readvertise), 2),
            "readvertise_s_max": round(max(readvertise), 2), "cores": os.cpu_count(),
        }
    finally:
        if agent is not None:
            agent.stop()
        nodes.stop()
        ext.stop()
        bed.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    print(f"cores: {os.cpu_count()}; 1 real node, {args.runs} faults", flush=True)
    print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
