"""gpupool's default policy: FGD's placement, plus what a live cluster needs and a trace cannot show.

Node and share GPU: FGD's integer fragmentation-gradient score with ties to the fixed node order. Every
variant we replayed (exact scores, other quantisation, fullness or CPU tie-breaks, GPU-level best fit,
GPU-demand-weighted workloads, structured node orders) did no better on the bundled traces; see
docs/placement.md for the numbers. Multi-GPU pods: the set of fitting GPUs with the most NVLink links,
then the fewest NUMA nodes, then the lowest indices (the trace has no topology, so replays are equal to
FGD). With no observed workload, fragmentation is measured against whole, half and quarter GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupool.core.model import PodRequest
from gpupool.core.policies.fgd import FGD
from gpupool.core.policy import PolicyContext
from gpupool.core.state import BoolArray, ClusterState


def linked_gpus(state: ClusterState, node: int, candidates: list[int], count: int) -> tuple[int, ...]:
    """Greedy: from each start GPU, add the candidate with most NVLink links to the chosen set (ties:
    same NUMA node, then lower index); keep the set with the most links, then fewest NUMA nodes."""
    gpus = state.nodes[node].gpus
    best: tuple[int, int, tuple[int, ...]] | None = None
    for start in candidates:
        chosen = [start]
        while len(chosen) < count:
            rest = [c for c in candidates if c not in chosen]
            links = [sum(c in gpus[x].nvlink_peers for x in chosen) for c in rest]
            same_numa = [sum(gpus[c].numa_node == gpus[x].numa_node for x in chosen) for c in rest]
            pick = max(range(len(rest)), key=lambda r: (links[r], same_numa[r], -rest[r]))
            chosen.append(rest[pick])
        total_links = sum(b in gpus[a].nvlink_peers for a in chosen for b in chosen if a < b)
        numa = len({gpus[c].numa_node for c in chosen})
        key = (total_links, -numa, tuple(sorted(chosen)))
        if best is None or (key[0], key[1]) > (best[0], best[1]):
            best = key
    return best[2] if best else ()


@dataclass(frozen=True, slots=True)
class GpupoolPolicy(FGD):
    name: str = "gpupool"

    def choose(
        self, state: ClusterState, pod: PodRequest, node: int, gpu_fit: BoolArray, ctx: PolicyContext
    ) -> tuple[int, ...]:
        if pod.gpu.count > 1:
            return linked_gpus(state, node, [int(j) for j in np.flatnonzero(gpu_fit)], pod.gpu.count)
        return FGD.choose(self, state, pod, node, gpu_fit, ctx)
