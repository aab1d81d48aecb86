"""PreFilter `pod_pending`: only a pod that still waits for a node is scheduled.

In a scheduling cycle (filter, prioritize) a pod that is bound, finished or being deleted is refused; in
the binding cycle only one being deleted is (a bound pod is a replay, which the `binding` plugin answers);
in a move's question (Phase.MOVE) a finished one or one being deleted is (its pod is bound: it runs).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from gpupool.api.counted import TERMINAL_PHASES
from gpupool.scheduler.framework.cycle import CycleState, Phase
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import SUCCESS, Status, unresolvable


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PodPending:
    name: ClassVar[str] = "pod_pending"
    gpu_only: ClassVar[bool] = False

    def __init__(self, handle: Handle, args: Args) -> None:
        pass

    def pre_filter(self, cycle: CycleState) -> Status:
        pod = cycle.pod
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            return unresolvable(f"pod {cycle.key} is being deleted")
        if cycle.phase is Phase.BIND:
            return SUCCESS
        phase = (pod.get("status") or {}).get("phase")
        if cycle.phase is Phase.MOVE:  # a running pod's share moves: bound is what it must be
            return unresolvable(f"pod {cycle.key} has finished ({phase})") if phase in TERMINAL_PHASES else SUCCESS
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound:
            return unresolvable(f"pod {cycle.key} is already bound to {bound}")
        if phase in TERMINAL_PHASES:
            return unresolvable(f"pod {cycle.key} has finished ({phase})")
        return SUCCESS
