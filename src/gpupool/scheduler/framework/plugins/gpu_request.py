"""PreFilter `gpu_request`: what the pod asks of GPUs, read from the API's pod (gpupool.api.pod).

A pod asking for no gpupool resource is SKIP: every `gpu_only` plugin leaves it alone (kube-scheduler
places it by its own rules). An unreadable or impossible request, or an unknown policy, is
UNSCHEDULABLE_AND_UNRESOLVABLE with the reason, the same text on every node.

kube-scheduler asks about the same pod two or three times (filter, prioritize, bind), so the reading is
kept per pod UID for the resourceVersion it was read at (a changed pod is read again), for at most
`MAX_KEPT` pods.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from gpupool.api.pod import ParsedPod, parse_pod, wants_gpu
from gpupool.core.policies import UnknownPolicy
from gpupool.scheduler.framework.cycle import CycleState
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import SKIP, SUCCESS, Status, unresolvable

MAX_KEPT = 4096


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GPURequestPlugin:
    name: ClassVar[str] = "gpu_request"
    gpu_only: ClassVar[bool] = False

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle
        self._kept: dict[str, tuple[str, ParsedPod | None]] = {}  # uid -> (resourceVersion, reading)

    def _read(self, cycle: CycleState) -> ParsedPod | None:
        """The pod's parsed request, None when it asks for no gpupool resource."""
        version = str((cycle.pod.get("metadata") or {}).get("resourceVersion") or "")
        kept = self._kept.get(cycle.uid)
        if kept is not None and version and kept[0] == version:
            return kept[1]
        parsed = parse_pod(cycle.pod) if wants_gpu(cycle.pod) else None
        if version:
            self._kept.pop(cycle.uid, None)
            self._kept[cycle.uid] = (version, parsed)
            if len(self._kept) > MAX_KEPT:
                del self._kept[next(iter(self._kept))]  # the longest unread
        return parsed

    def pre_filter(self, cycle: CycleState) -> Status:
        parsed = self._read(cycle)
        if parsed is None:
            return SKIP
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
