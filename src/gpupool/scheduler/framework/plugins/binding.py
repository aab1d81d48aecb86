"""Bind `binding`: the Binding, which for a GPU pod carries `gpupool.io/allocation` in its annotations (the
API server copies them onto the pod in the same write that sets spec.nodeName, so no pod is ever bound
without its allocation, nor annotated but unbound).

A 409 on the Binding reads the pod again: bound here with this very allocation is success (a replay that
raced), anything else fails the bind. `done` answers a replayed bind before anything is decided: the pod
already bound here with its allocation is success without a write; bound elsewhere is refused.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from gpupool.api.allocation import encode_allocation
from gpupool.api.counted import counted_allocation, grants_signature
from gpupool.api.names import ANN_ALLOCATION, DEFAULT_ISOLATION
from gpupool.api.times import format_time
from gpupool.cluster.port import Conflict, NotFound
from gpupool.scheduler.framework.cycle import CycleState
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import SUCCESS, Status, unschedulable
from gpupool.scheduler.pods import PodRef, PodRefused


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Binding:
    name: ClassVar[str] = "binding"
    gpu_only: ClassVar[bool] = False

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle

    def done(self, cycle: CycleState, node: str) -> Status | None:
        """A replay that already took effect (SUCCESS), a pod bound elsewhere (refused), or None."""
        bound = (cycle.pod.get("spec") or {}).get("nodeName")
        if not bound:
            return None
        counted = counted_allocation(cycle.pod)
        if bound == node and (counted is not None or not cycle.wants_gpu):
            if counted is not None:
                self.handle.ledger.apply_pod("MODIFIED", cycle.pod)
            return SUCCESS
        return unschedulable(f"pod {cycle.key} is already bound to {bound}")

    async def bind(self, cycle: CycleState, node: str) -> Status:
        h = self.handle
        namespace, name = cycle.key.split("/", 1)
        annotations: dict[str, str] | None = None
        if cycle.wants_gpu:
            assert cycle.allocation is not None and cycle.parsed is not None
            isolation = cycle.parsed.isolation or DEFAULT_ISOLATION
            annotations = {ANN_ALLOCATION: encode_allocation(
                cycle.allocation, cycle.uid, isolation, format_time(h.clock()), cycle.parsed.containers)}
        try:
            await h.cluster.create_binding(namespace, name, cycle.uid, node, annotations)
        except NotFound:
            return unschedulable(f"pod {cycle.key} no longer exists")
        except Conflict:
            if not cycle.wants_gpu:
                raise
            h.metrics.conflicts.labels("pod").inc()
            try:
                fresh = await h.pods.fetch(PodRef(namespace, name, cycle.uid))
            except PodRefused as e:
                return unschedulable(str(e))
            counted = counted_allocation(fresh)
            assert cycle.allocation is not None
            same = (fresh.get("spec") or {}).get("nodeName") == node and counted is not None \
                and grants_signature(counted.allocation) == grants_signature(cycle.allocation)
            if not same:
                return unschedulable(f"pod {cycle.key} was bound elsewhere meanwhile")
        return SUCCESS
