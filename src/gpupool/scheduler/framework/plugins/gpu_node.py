"""Filter `gpu_node`: a GPU pod goes only to gpupool nodes (a node whose agent published a valid
`gpupool.io/inventory`); others are UNSCHEDULABLE_AND_UNRESOLVABLE with the reason (no inventory, or what
is wrong with it)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from gpupool.scheduler.framework.cycle import CycleState, NodeSet
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import Code

NO_INVENTORY = "node has no gpupool inventory (no gpupool agent on it)"


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GPUNode:
    name: ClassVar[str] = "gpu_node"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle

    def filter(self, cycle: CycleState, nodes: NodeSet) -> None:
        bad = nodes.nodes() < 0
        if not bad.any():
            return
        errors = self.handle.ledger.node_errors
        names = nodes.alive_names()
        nodes.reject(bad, [errors.get(names[k]) or NO_INVENTORY for k in np.flatnonzero(bad).tolist()],
                     Code.UNSCHEDULABLE_AND_UNRESOLVABLE)
