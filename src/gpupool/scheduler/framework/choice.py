"""The GPUs a cycle's pod gets on the node chosen for it: one rule for every Reserve plugin that takes
capacity (`nominate` for a pod, `claim_reserve` for a DRA claim), so both forms get the same GPUs from the
same state."""

from __future__ import annotations

import numpy as np

from gpupool.core.model import Allocation
from gpupool.core.placement import Placement, place
from gpupool.core.policy import PolicyContext
from gpupool.core.state import ClusterState
from gpupool.scheduler.framework.cycle import CycleState


def gpus_on(state: ClusterState, ctx: PolicyContext, cycle: CycleState, node: str) -> Allocation | None:
    """The GPUs the pod's policy picks on `node` (gpupool.core.placement.place on that node), unless a
    plugin placed the pod already (cycle.placed). Where a Filter plugin narrowed the node's GPUs
    (cycle.narrowed), the same steps over the GPUs it left: score the node, then choose among them."""
    request, policy, gpu_ok = cycle.request, cycle.policy, cycle.gpu_ok
    i = state.index.get(node)
    if request is None or policy is None or gpu_ok is None or i is None:
        return None
    if cycle.placed is not None:
        return cycle.placed.get(i)  # decided by a plugin (mig_placement: the instance it chose here)
    nodes = np.array([i], dtype=np.int64)
    if i not in cycle.narrowed:
        result = place(state, request, policy, ctx, nodes)
        return result.allocation if isinstance(result, Placement) else None
    row = gpu_ok[i]
    if int(row.sum()) < request.gpu.count:
        return None
    policy.score(state, request, nodes, row[None, :], ctx)  # choose() centres on this score
    gpus = policy.choose(state, request, i, row, ctx) if request.gpu.count else ()
    return Allocation(pod=request.key, node=node, grants=state.grants_for(i, request, gpus), policy=policy.name)
