"""Autoscaling on a pod's GPU share: seconds from load to scale-up and from idle to scale-down.

    python benchmarks/hpa.py [--runs 3]        # root (real kubelet + containerd); last line JSON

The stack of tests/e2e/test_e2e_hpa.py (`HpaStack`): a control plane with the aggregation layer, the chart's
extender and kube-scheduler, one real node with 3 fake GPUs and its gpupool agent, Prometheus scraping the
agent every second, KEDA's operator and metrics apiserver, and deploy/autoscaling/keda-scaledobject.yaml
with the test's timings (kube-controller-manager's HPA sync every 2 s, KEDA polling every 2 s, rate over
6 s, scale-down stabilization 6 s). Each run: the Deployment of share pods (20 % of a GPU each) at 1
replica and its ScaledObject applied, and once KEDA's HPA reads the metric, the pods' load switched on:
- `scale_up_s`: load on -> the HPA controller first raises the Deployment's replicas;
- `scale_up_max_s`: load on -> all 4 replicas ready;
- `scale_down_s`: load off -> the HPA controller has set the replicas back to 1.
Times are this process's clock, the API polled every second (so +-1 s), medians over the runs. They are
made of the configured intervals (scrape, rate window, KEDA's and the HPA's sync, the stabilization
window) plus pod start-up on the real node; they are not a property of gpupool alone. `env_ok`: every run
reached 4 replicas under load and 1 when idle, without a step in the wrong direction.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e import test_e2e_hpa as hpa  # noqa: E402


def one_run(stack: hpa.HpaStack, run: int) -> dict[str, Any]:
    assert stack.switch is not None
    stack.deploy()
    stack.switch.on = True
    t0 = time.monotonic()
    up = stack.follow(lambda s: s.replicas == hpa.MAX_REPLICAS and s.ready == hpa.MAX_REPLICAS, 600, "scale-up")
    first = next(s.t for s in up if s.replicas > hpa.MIN_REPLICAS)
    up_max = time.monotonic() - t0
    stack.switch.on = False
    down = stack.follow(lambda s: s.replicas == hpa.MIN_REPLICAS, 600, "scale-down")
    ups, downs = [s.replicas for s in up], [s.replicas for s in down]
    ok = (all(a <= b for a, b in zip(ups, ups[1:], strict=False))
          and all(a >= b for a, b in zip(downs, downs[1:], strict=False)))
    print(f"  run {run}: scale-up after {first:.1f} s, {hpa.MAX_REPLICAS} ready after {up_max:.1f} s; "
          f"scale-down after {down[-1].t:.1f} s; replicas up {ups}, down {downs}", flush=True)
    stack.undeploy()
    return {"scale_up_s": first, "scale_up_max_s": up_max, "scale_down_s": down[-1].t,
            "replicas_max": max(ups), "ok": ok}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    print(f"cores: {os.cpu_count()}; 1 real node with 3 fake GPUs, share pods of {hpa.CORES} %, "
          f"{hpa.MIN_REPLICAS}..{hpa.MAX_REPLICAS} replicas, {args.runs} runs", flush=True)
    stack = hpa.HpaStack().start()
    try:
        assert stack.bed is not None
        version = stack.bed.server_version()
        runs = [one_run(stack, i + 1) for i in range(args.runs)]
    finally:
        stack.stop()

    def median(key: str) -> float:
        return round(statistics.median(r[key] for r in runs), 1)

    print(json.dumps({
        "kubernetes_version": version, "keda_version": hpa.ktb.KEDA_VERSION,
        "scale_up_s": median("scale_up_s"), "scale_up_max_s": median("scale_up_max_s"),
        "scale_down_s": median("scale_down_s"), "replicas_max": max(r["replicas_max"] for r in runs),
        "env_ok": all(r["ok"] and r["replicas_max"] == hpa.MAX_REPLICAS for r in runs),
        "runs": args.runs, "cores": os.cpu_count(), "hpa_sync_s": hpa.ktb.AggregatingTestbed.hpa_sync_s,
    }), flush=True)


if __name__ == "__main__":
    main()
