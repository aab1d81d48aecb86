"""MIG start-slot placement on the bundled traces, every GPU mapped to one MIG model (default H100-80GB).

Per trace and seed (gpupool.core.mig_whatif): unallocated GPU % when arrived demand reaches 100 % of the
cluster, and the mean unallocated % over CHURN further steps in which a random running pod ends (its
instance destroyed) and the next pod arrives -- the steady state where slice layouts fragment. Compared:
  mig-frag    gpupool's placement (slice fragmentation against the observed profile mix);
  mig-first   first-fit: first GPU that fits, lowest allowed start slot;
  mig-dra     first-fit, highest allowed start slot first: kube-scheduler's allocator over the partitions
              gpupool's DRA driver publishes, in their order (docs/claims.md; kube-scheduler may also spread
              claims over nodes, which this leaves out: it can only fragment more);
  whole       whole GPUs per pod;
  hook        exact shares (best fit), what MIG costs against software sharing.
Prints the median over seeds; last line one JSON object.
Usage: python benchmarks/mig_placement.py [--traces default,gpushare100,multigpu50] [--seeds 42,43,44]
       [--churn 20000] [--gpu-model H100-80GB]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from gpupool.core.mig_whatif import what_if
from gpupool.sim.trace import NODES_FILE, TRACE_DIR, load_nodes, load_pods, resolve_trace

VARIANTS = ("mig-frag", "mig-first", "mig-dra", "whole", "hook")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default="default,gpushare100,multigpu50")
    parser.add_argument("--seeds", default="42,43,44")
    parser.add_argument("--churn", type=int, default=20000)
    parser.add_argument("--gpu-model", default="H100-80GB")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    counts = [len(n.gpus) for n in load_nodes(TRACE_DIR / NODES_FILE) if n.gpus]
    print(f"mig_placement: {sum(counts)} GPUs as {args.gpu_model}, seeds {seeds}, churn {args.churn} steps, "
          f"{os.cpu_count()} CPU cores (median over seeds)")
    summary: dict[str, dict[str, dict[str, float | None]]] = {}
    for trace in [t.strip() for t in args.traces.split(",") if t.strip()]:
        pods = load_pods(resolve_trace(trace))
        at100: dict[str, list[float]] = {v: [] for v in VARIANTS}
        churn: dict[str, list[float]] = {v: [] for v in VARIANTS}
        needed: dict[str, list[float]] = {v: [] for v in VARIANTS}
        started = time.perf_counter()
        for seed in seeds:
            rows = what_if(counts, pods, args.gpu_model, ("mig", "whole", "hook"), seed=seed, churn=args.churn)
            first = what_if(counts, pods, args.gpu_model, ("mig",), seed=seed, mig_first_fit=True, churn=args.churn)
            dra = what_if(counts, pods, args.gpu_model, ("mig",), seed=seed, mig_first_fit=True, churn=args.churn,
                          mig_highest_start=True)
            for name, row in zip(("mig-frag", "whole", "hook", "mig-first", "mig-dra"), (*rows, *first, *dra),
                                 strict=True):
                at100[name].append(row.unallocated_pct)
                needed[name].append(row.gpus_needed)
                if args.churn > 0:  # a figure asked for and missing is an error, never a 0 %
                    if row.churn_unallocated_pct is None:
                        raise SystemExit(f"{trace}, seed {seed}, {name}: no churn figure for --churn {args.churn}")
                    churn[name].append(row.churn_unallocated_pct)
        summary[trace] = {v: {"unallocated_pct_at_100": round(statistics.median(at100[v]), 2),
                              # None (JSON null, printed "-"): not measured (--churn 0)
                              "unallocated_pct_churn": round(statistics.median(churn[v]), 2) if churn[v] else None,
                              "gpus_needed": statistics.median(needed[v])} for v in VARIANTS}
        print(f"{trace} ({len(pods)} pods, {time.perf_counter() - started:.0f} s)")
        print(f"  {'variant':<10} {'unalloc % @100 %':>17} {'unalloc % churn':>16} {'GPUs needed':>12}")
        for v in VARIANTS:
            s = summary[trace][v]
            at_churn = "-" if s["unallocated_pct_churn"] is None else f"{s['unallocated_pct_churn']:.2f}"
            print(f"  {v:<10} {s['unallocated_pct_at_100']:>17.2f} {at_churn:>16} {s['gpus_needed']:>12,.0f}")
    print(json.dumps({"gpu_model": args.gpu_model, "seeds": seeds, "churn": args.churn, "cores": os.cpu_count(),
                      "traces": summary}))


if __name__ == "__main__":
    main()
