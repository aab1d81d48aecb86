"""Filter `claim_devices` (the claim profile, after `gpu_fit`): a DRA claim gets only gpupool's devices of
its kind (`cycle.claim.gpus`: the untainted devices of the newest ResourceSlices, see `claim_nodes`).

The node's other GPUs (a tainted device, a GPU without a GPU server for a remote share, a GPU in MIG mode
for a share) are taken out of those gpu_fit offered (`cycle.gpu_ok`, as shares_per_gpu and mps_ready
narrow it), so the policy's GPU choice and Reserve see only the claim's devices, and a node left with fewer
than the claim asks for fails with the reason (UNSCHEDULABLE: the claim's devices there may free up).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from gpupool.core.state import BoolArray, ClusterState
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
        # The claim's devices as a matrix like gpu_ok's, for the devices and the ledger's state it was made
        # from: one per allocation pass and kind, not a loop over every node per claim (60 ms a claim on
        # 5,000 nodes).
        self._usable: tuple[Mapping[str, frozenset[int]], ClusterState, BoolArray] | None = None

    def usable(self, gpus: Mapping[str, frozenset[int]], shape: tuple[int, ...]) -> BoolArray:
        """Per node and GPU slot (rows of the ledger's state), whether it is one of `gpus`."""
        state = self.handle.ledger.state
        kept = self._usable
        if kept is not None and kept[0] is gpus and kept[1] is state and kept[2].shape == shape:
            return kept[2]
        matrix = np.zeros(shape, dtype=bool)
        for name, indices in gpus.items():
            i = state.index.get(name)
            if i is not None and i < shape[0]:
                matrix[i, [j for j in indices if 0 <= j < shape[1]]] = True
        self._usable = (gpus, state, matrix)
        return matrix

    def filter(self, cycle: CycleState, nodes: NodeSet) -> None:
        claim, request, gpu_ok = cycle.claim, cycle.request, cycle.gpu_ok
        if claim is None or request is None or gpu_ok is None:
            return
        idx = nodes.nodes()
        usable = self.usable(claim.gpus, gpu_ok.shape)[idx]
        other = gpu_ok[idx] & ~usable
        narrowed = np.flatnonzero(other.any(axis=1))  # positions in idx of nodes with GPUs not the claim's
        if not len(narrowed):
            return
        bad = np.zeros(len(idx), dtype=bool)
        reasons: list[str] = []
        for k in narrowed.tolist():
            i = int(idx[k])
            row = gpu_ok[i]
            row &= usable[k]
            cycle.narrowed[i] = f"GPU {', '.join(map(str, np.flatnonzero(other[k]).tolist()))}: {NOT_ITS_DEVICE}"
            left = int(row.sum())
            if left < request.gpu.count:
                bad[k] = True
                reasons.append(f"needs {request.gpu.count} GPU(s), {left} of its devices fit ({cycle.narrowed[i]})")
        nodes.reject(bad, reasons, Code.UNSCHEDULABLE)
