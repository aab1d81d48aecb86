"""Filter `claim_devices` (the claim profile): a DRA claim gets only gpupool's devices that its kind of
claim may use, on nodes its pod may run on.

The devices are those of the newest ResourceSlices without a NoSchedule/NoExecute taint, of the claim's
kind (`cycle.claim.gpus`, read by the claim allocator): shared GPUs for a share, GPUs in MIG mode for a MIG
partition, shared GPUs with a GPU server for a remote share. The node's other GPUs are taken out of those
gpu_fit offered (`cycle.gpu_ok`, as shares_per_gpu and mps_ready narrow it), and a node left with fewer than
the claim asks for fails with the reason.

The pod may run on the node: its nodeSelector and required node affinity, the node's NoSchedule/NoExecute
taints (gpupool.scheduler.node_rules). For a pod kube-scheduler checks these before it asks the extender;
for a claim nobody does before the allocation pins the pod to the node, after which kube-scheduler would
refuse it there for ever. A remote share's GPU node is not where its pod runs: `remote_tiers` checks the
pod's node instead.
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


class ClaimDevices:
    name: ClassVar[str] = "claim_devices"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle

    def filter(self, cycle: CycleState, nodes: NodeSet) -> None:
        claim, request = cycle.claim, cycle.request
        if claim is None or request is None:
            return
        remote = claim.isolation == REMOTE_ISOLATION
        ledger = self.handle.ledger
        gpu_ok = cycle.gpu_ok
        idx = nodes.nodes()
        names = nodes.alive_names()
        bad = np.zeros(len(idx), dtype=bool)
        reasons: list[str] = []
        for k, i in enumerate(idx.tolist()):
            name = names[k]
            usable = claim.gpus.get(name) or frozenset()
            why = NO_DEVICE if not usable else None
            if why is None and not remote and not may_run(cycle.pod, ledger.node_objs.get(name)):
                why = NOT_HERE
            if why is None and i >= 0 and gpu_ok is not None:
                row = gpu_ok[i]
                other = [j for j in np.flatnonzero(row).tolist() if j not in usable]
                if other:
                    row[other] = False
                    cycle.narrowed[i] = f"GPU {', '.join(map(str, other))}: {NO_DEVICE}"
                    left = int(row.sum())
                    if left < request.gpu.count:
                        why = f"needs {request.gpu.count} GPU(s), {left} of its devices fit ({cycle.narrowed[i]})"
            if why is not None:
                bad[k] = True
                reasons.append(why)
        nodes.reject(bad, reasons, Code.UNSCHEDULABLE)
