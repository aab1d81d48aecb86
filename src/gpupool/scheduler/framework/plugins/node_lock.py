"""Permit / Unreserve `node_lock`: one GPU pod per node between its bind and its device allocation.

Kubelet's Allocate does not say which pod it is for, and the node agent serves only the single pod of the
node that waits for one (gpupool.agent.identify): a second pod bound meanwhile would make the agent refuse
both. Permit therefore waits while another pod bound to the node still waits for its Allocate (the busy
holds of gpupool.scheduler.busy, kept from this process's binds and the pod watch; no API call), for at
most `lock_wait_s`, woken by the pod watch (and every 0.2 s, to see an expiry), then refuses
(kube-scheduler retries the pod). A holder older than `lock_timeout_s` no longer blocks the node. Permit
takes the node for the pod before the Binding is written; Unreserve (any failure after that) gives it
back, and only a cycle that took it: a refused bind of a pod that holds a node already (a replay, or a
bind to another node) leaves that hold alone.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from gpupool.api.times import format_time
from gpupool.scheduler.framework.cycle import CycleState
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import SUCCESS, Status, unschedulable, wait


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    lock_wait_s: float = Field(default=5.0, ge=0)


class NodeLock:
    name: ClassVar[str] = "node_lock"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle
        self.max_wait_s = args.lock_wait_s

    async def permit(self, cycle: CycleState, node: str) -> Status:
        h = self.handle
        now = h.clock()
        already = h.busy.bound_to(cycle.uid)
        if already == node:
            return SUCCESS  # a replay of a bind that took the node (the watch has not shown the pod bound yet)
        if already is not None:
            return unschedulable(f"pod {cycle.key} is being bound to {already}")
        held = h.busy.waiting_on(node, now, other_than=cycle.uid)
        if held is not None:
            return wait(f"node {node} has pod {held.key}, bound at {format_time(held.since)}, still waiting for "
                        "its device allocation; retry later", h.waiter(node), min(0.2, held.until - now))
        h.busy.bound(cycle.uid, cycle.key, node, now)
        cycle.data[self.name] = True  # this cycle took the node: its Unreserve gives it back
        return SUCCESS

    async def unreserve(self, cycle: CycleState, node: str) -> None:
        if cycle.data.get(self.name):
            self.handle.busy.unbind(cycle.uid)
