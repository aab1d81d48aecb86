"""One number per policy: the unallocated GPU % that `gpupool simulate` prints first, for scripts to compare.

It is the simulator's own figure, computed by its own code: replays of FGD's protocol (gpupool.sim.replay),
run in parallel like the command's (gpupool.sim.parallel), summarised as in results.json
(gpupool.sim.report.summarise): GPU capacity left unallocated, in percent, when the arrived GPU demand
reaches 100 % of capacity, the mean over seeds. Pods that fit nowhere are dropped and the replay goes on, so
this is not "the first failure"; it is the measure the rest of the project (docs/simulate.md,
docs/placement.md, benchmarks/simulate_fidelity.py) reports.

Default seeds 42, 43 and 44 (`gpupool simulate`'s default of three seeds from 42), the whole trace, no subset:
on 2 cores (quiet machine) `gpupool` took 21 s on `default`, 28 s on `gpushare100` (the slowest bundled trace)
and 15 s on `multigpu50`; `dra-default` 6 to 12 s.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpupool.core.policies import get_policy
from gpupool.sim.parallel import Job, available_cores, run_all
from gpupool.sim.replay import replay
from gpupool.sim.report import summarise
from gpupool.sim.trace import NODES_FILE, TRACE_DIR, load_nodes, load_pods, resolve_trace

DEFAULT_TRACE = "default"
DEFAULT_SEEDS = (42, 43, 44)


def unallocated_pct(
    policy: str,
    trace: str | None = None,
    *,
    nodes: str | Path | None = None,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    workers: int | None = None,
) -> float:
    """Unallocated GPU % at arrived demand = 100 % for `policy`, mean over `seeds`.

    `trace`: a bundled trace name (default, gpushare100, multigpu50) or a pod CSV path; None is `default`.
    `nodes`: a node CSV path; None is the trace's 1,213 GPU nodes. `workers`: replays at once (default: the
    usable cores). Raises UnknownPolicy for a policy name not in the registry, TraceError for a bad file.
    """
    get_policy(policy)  # an unknown name fails here, not in a worker process
    if not seeds:
        raise ValueError("no seeds given")
    node_list = load_nodes(Path(nodes) if nodes is not None else TRACE_DIR / NODES_FILE)
    pods = load_pods(resolve_trace(trace if trace is not None else DEFAULT_TRACE))
    logs = run_all(replay, node_list, pods, [Job(policy, s) for s in seeds], workers or available_cores())
    return float(summarise(logs)["unallocated_pct_at_100"])
