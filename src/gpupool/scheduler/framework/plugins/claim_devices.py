"""Filter `claim_devices` (the claim profile, after `gpu_fit`): a DRA claim gets only gpupool's devices of
its kind (`cycle.claim.gpus`: the untainted devices of the newest ResourceSlices, see `claim_nodes`).

The node's other GPUs (a tainted device, a GPU without a GPU server for a remote share, a GPU in MIG mode
for a share) are taken out of those gpu_fit offered (`cycle.gpu_ok`, as shares_per_gpu and mps_ready
narrow it), so the policy's GPU choice and Reserve see only the claim's devices, and a node left with fewer
than the claim asks for fails with the reason (UNSCHEDULABLE: the claim's devices there may free up).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from gpupool.scheduler.framework.cycle import CycleState, NodeSet
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import Code

NOT_ITS_DEVICE = "no untainted device of gpupool's DRA driver for this claim"


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ClaimDevices:
    name: ClassVar[str] = "claim_devices"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle

    def filter(self, cycle: CycleState, nodes: NodeSet) -> None:
        claim, request, gpu_ok = cycle.claim, cycle.request, cycle.gpu_ok
        if claim is None or request is None or gpu_ok is None:
            return
        idx = nodes.nodes()
        names = nodes.alive_names()
        bad = np.zeros(len(idx), dtype=bool)
        reasons: list[str] = []
        for k, i in enumerate(idx.tolist()):
            usable = claim.gpus.get(names[k], frozenset())
            row = gpu_ok[i]
            other = [j for j in np.flatnonzero(row).tolist() if j not in usable]
            if not other:
                continue
            row[other] = False
            cycle.narrowed[i] = f"GPU {', '.join(map(str, other))}: {NOT_ITS_DEVICE}"
            left = int(row.sum())
            if left < request.gpu.count:
                bad[k] = True
                reasons.append(f"needs {request.gpu.count} GPU(s), {left} of its devices fit ({cycle.narrowed[i]})")
        nodes.reject(bad, reasons, Code.UNSCHEDULABLE)
