"""Score `prefer_no_schedule`: the winner avoids nodes with a `PreferNoSchedule` taint the pod does not
tolerate while another node fits. kube-scheduler's TaintToleration score does this for the pods it scores;
a GPU pod whose node the extender decides in /filter is never scored there, so the policy honours the taint
itself. It changes which node wins, not the scores reported."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from gpupool.api.preferences import untolerated
from gpupool.core.state import IntArray
from gpupool.scheduler.framework.cycle import CycleState
from gpupool.scheduler.framework.interface import Handle, NodeScores


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PreferNoSchedule:
    name: ClassVar[str] = "prefer_no_schedule"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle
        self.args = args

    def score(self, cycle: CycleState, nodes: IntArray) -> NodeScores:
        ledger = self.handle.ledger
        if not ledger.soft_taints:
            return NodeScores()
        index = ledger.state.index
        tainted = [index[n] for n, taints in ledger.soft_taints.items()
                   if n in index and untolerated(cycle.pod, taints)]
        return NodeScores(avoid=np.isin(nodes, tainted)) if tainted else NodeScores()
