"""PostFilter `pending_note`: a GPU pod that fits no offered node is noted, with one node's reason as the
example (the one that passed the most checks) and since when, for the pool views (`gpupool top`, the
dashboard, /pool). The map is bounded and expires (gpupool.scheduler.pending). Later issues add preemption
as another PostFilter plugin."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from gpupool.scheduler.framework.cycle import CycleState, NodeSet
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import SUCCESS, Status


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PendingNote:
    name: ClassVar[str] = "pending_note"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle

    def post_filter(self, cycle: CycleState, nodes: NodeSet) -> Status:
        example = nodes.example()
        self.handle.pending.note(cycle.key, f"fits no node, e.g. {example or 'no gpupool node offered'}")
        return SUCCESS
