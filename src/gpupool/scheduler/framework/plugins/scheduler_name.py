"""PreFilter `scheduler_name`: gpupool decides only for pods whose spec.schedulerName is gpupool's.

A pod of another scheduler (the API server writes `default-scheduler` when a pod names none) is
UNSCHEDULABLE_AND_UNRESOLVABLE: gpupool neither places nor binds it, whatever a caller asks.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from gpupool.scheduler.framework.cycle import CycleState
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import SUCCESS, Status, unresolvable

DEFAULT_SCHEDULER = "default-scheduler"


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    scheduler_name: str


class SchedulerName:
    name: ClassVar[str] = "scheduler_name"
    gpu_only: ClassVar[bool] = False

    def __init__(self, handle: Handle, args: Args) -> None:
        self.args = args

    def pre_filter(self, cycle: CycleState) -> Status:
        named = str((cycle.pod.get("spec") or {}).get("schedulerName") or DEFAULT_SCHEDULER)
        if named != self.args.scheduler_name:
            return unresolvable(f"pod {cycle.key} is for scheduler {named[:64]!r} (spec.schedulerName), "
                                f"not {self.args.scheduler_name!r}")
        return SUCCESS
