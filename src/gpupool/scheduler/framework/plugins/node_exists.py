"""Filter `node_exists`: a node the cluster does not have is UNSCHEDULABLE_AND_UNRESOLVABLE, for every
pod (the API server accepts a Binding to any node name; gpupool does not). The name comes from the caller:
the reason shows it escaped and bounded (gpupool.api.logsafe)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from gpupool.api.logsafe import shown
from gpupool.scheduler.framework.cycle import CycleState, NodeSet
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import Code

MAX_NAME_SHOWN = 64


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NodeExists:
    name: ClassVar[str] = "node_exists"
    gpu_only: ClassVar[bool] = False

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle

    def filter(self, cycle: CycleState, nodes: NodeSet) -> None:
        idx = nodes.nodes()
        unknown = np.flatnonzero(idx < 0)  # gpupool nodes exist: only the others need a look
        if not len(unknown):
            return
        objs = self.handle.ledger.node_objs
        names = nodes.alive_names()
        missing = [k for k in unknown.tolist() if names[k] not in objs]
        if missing:
            bad = np.zeros(len(idx), dtype=bool)
            bad[missing] = True
            nodes.reject(bad, [f"node {shown(names[k], MAX_NAME_SHOWN)} does not exist" for k in missing],
                         Code.UNSCHEDULABLE_AND_UNRESOLVABLE)
