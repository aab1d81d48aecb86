"""Filter `claim_nodes` (the claim profile, before `gpu_fit`): a DRA claim goes only to nodes that publish
gpupool's devices of its kind and that its pod may run on.

The devices are those of the newest ResourceSlices without a NoSchedule/NoExecute taint, of the claim's
kind (`cycle.claim.gpus`, read by the claim allocator): shared GPUs for a share, GPUs in MIG mode for a MIG
partition, shared GPUs with a GPU server for a remote share. The pod may run on the node: its nodeSelector
and required node affinity, the node's NoSchedule/NoExecute taints (gpupool.scheduler.node_rules). A remote
share's GPU node is not where its pod runs: `remote_tiers` checks the pod's node instead.

For a pod kube-scheduler applies these rules before it asks the extender, and offers only the nodes that
pass; for a claim nobody does before its allocation pins the pod to the node. So the others fail first, as
UNSCHEDULABLE_AND_UNRESOLVABLE: no PostFilter may evict pods there to make room (kube-scheduler would then
refuse the pod there for ever).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from gpupool.api.dra import REMOTE_ISOLATION
from gpupool.scheduler.framework.cycle import CycleState, NodeSet
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import Code
from gpupool.scheduler.node_rules import MAY_RUN, may_run

NO_DEVICE = "no untainted device of gpupool's DRA driver here for this claim"
NOT_HERE = f"the pod may not run here ({MAY_RUN})"


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ClaimNodes:
    name: ClassVar[str] = "claim_nodes"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle

    def filter(self, cycle: CycleState, nodes: NodeSet) -> None:
        claim = cycle.claim
        if claim is None:
            return
        remote = claim.isolation == REMOTE_ISOLATION
        objs = self.handle.ledger.node_objs
        names = nodes.alive_names()
        bad = np.zeros(len(names), dtype=bool)
        reasons: list[str] = []
        for k, name in enumerate(names):
            if name not in claim.gpus:
                bad[k] = True
                reasons.append(NO_DEVICE)
            elif not remote and not may_run(cycle.pod, objs.get(name)):
                bad[k] = True
                reasons.append(NOT_HERE)
        nodes.reject(bad, reasons, Code.UNSCHEDULABLE_AND_UNRESOLVABLE)
