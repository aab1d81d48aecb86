"""PreFilter `gpu_request`: what the pod asks of GPUs, read from the API's pod (gpupool.api.pod).

A pod asking for no gpupool resource is SKIP: every `gpu_only` plugin leaves it alone (kube-scheduler
places it by its own rules). An unreadable or impossible request, or an unknown policy, is
UNSCHEDULABLE_AND_UNRESOLVABLE with the reason, the same text on every node.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from gpupool.api.pod import parse_pod, wants_gpu
from gpupool.core.policies import UnknownPolicy
from gpupool.scheduler.framework.cycle import CycleState
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import SKIP, SUCCESS, Status, unresolvable


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GPURequestPlugin:
    name: ClassVar[str] = "gpu_request"
    gpu_only: ClassVar[bool] = False

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle

    def pre_filter(self, cycle: CycleState) -> Status:
        if not wants_gpu(cycle.pod):
            return SKIP
        parsed = parse_pod(cycle.pod)
        if parsed.errors or parsed.request is None:
            return unresolvable("invalid request: " + "; ".join(parsed.errors))
        problems = parsed.request.problems()
        if problems:
            return unresolvable("invalid request: " + "; ".join(problems))
        try:
            policy = self.handle.policy(parsed.request)
        except UnknownPolicy as e:
            return unresolvable(f"invalid request: {e}")
        cycle.parsed, cycle.request, cycle.policy = parsed, parsed.request, policy
        return SUCCESS
