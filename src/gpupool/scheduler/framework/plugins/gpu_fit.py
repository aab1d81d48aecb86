"""Filter `gpu_fit`: the pod's request against the free capacity of each node (gpupool.core.fit.check,
all nodes at once). Nodes without room are UNSCHEDULABLE with core's reason (e.g. `needs 1 x a GPU with 30
percent compute and 8192 MiB free; 0 available`). Leaves, per node, the GPU slots that can take the share
in `cycle.gpu_ok`, which later Filter plugins narrow and Score / Reserve use."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from gpupool.core.fit import OK, check
from gpupool.scheduler.framework.cycle import CycleState, NodeSet
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import Code


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GPUFit:
    name: ClassVar[str] = "gpu_fit"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle

    def filter(self, cycle: CycleState, nodes: NodeSet) -> None:
        assert cycle.request is not None
        state = self.handle.ledger.state
        idx = nodes.nodes()
        fit = check(state, cycle.request, idx)
        cycle.set_fit(idx, fit.gpu_fit, (len(state), state.width))
        bad = fit.code != OK
        if not bad.any():
            return
        # Reasons depend only on (code, number of fitting GPUs): write each distinct one once.
        rows = np.flatnonzero(bad)
        keys = fit.code[rows] * 1024 + fit.gpu_fit[rows].sum(axis=1)
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        texts = [fit.reason(int(rows[f]), cycle.request) for f in first]
        nodes.reject(bad, [texts[j] for j in inverse.tolist()], Code.UNSCHEDULABLE)
