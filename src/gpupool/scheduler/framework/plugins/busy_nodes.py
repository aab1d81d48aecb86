"""Score `busy_nodes`: the winner avoids nodes with a GPU pod nominated or bound and not yet allocated by
the agent (gpupool.scheduler.busy) while another node fits, so a burst of pods spreads instead of queueing
on one node, one pod per Allocate. It changes which node wins, not the scores reported."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from gpupool.core.state import IntArray
from gpupool.scheduler.framework.cycle import CycleState
from gpupool.scheduler.framework.interface import Handle, NodeScores


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    avoid: bool = True  # SchedulerConfig.avoid_busy_nodes


class BusyNodesScore:
    name: ClassVar[str] = "busy_nodes"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle
        self.args = args

    def score(self, cycle: CycleState, nodes: IntArray) -> NodeScores:
        if not self.args.avoid:
            return NodeScores()
        busy = self.handle.busy.names(self.handle.clock(), other_than=cycle.uid)
        if not busy:
            return NodeScores()
        index = self.handle.ledger.state.index
        return NodeScores(avoid=np.isin(nodes, [index[n] for n in busy if n in index]))
