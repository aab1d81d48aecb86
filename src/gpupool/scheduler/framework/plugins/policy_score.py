"""Score `policy_score`: the pod's placement policy (gpupool.io/policy, else the configured default) scores
the feasible nodes, with the GPU slots the Filter plugins left (`cycle.gpu_ok`). Higher is better; the
framework picks the winner with the policy's tie-break (the node rank)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from gpupool.core.state import IntArray
from gpupool.scheduler.framework.cycle import CycleState
from gpupool.scheduler.framework.interface import Handle, NodeScores


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PolicyScore:
    name: ClassVar[str] = "policy_score"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle

    def score(self, cycle: CycleState, nodes: IntArray) -> NodeScores:
        assert cycle.request is not None and cycle.policy is not None and cycle.gpu_ok is not None
        state = self.handle.ledger.state
        values = cycle.policy.score(state, cycle.request, nodes, cycle.gpu_ok[nodes], self.handle.context())
        return NodeScores(values=values)
