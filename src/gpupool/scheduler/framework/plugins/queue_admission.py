"""Filter / Reserve `queue_admission`: a pod runs only if its team queue admits it
(gpupool.core.queues.admit: guarantee, maximum, borrowing within the hierarchy).

Filter charges the pod as it would be on the largest GPU of the cluster (the least a share can be charged,
so a pod is never kept out by a card it will not get) and, when the queue refuses, rejects every node with
the queue's reason, e.g. "queue team-a: 3.5 of 3 GPUs guaranteed, cannot borrow: cohort full": the pending
note, `kubectl describe` (kube-scheduler's FailedScheduling) and the views show it. A refusal that
reclaiming cannot change (a maximum, borrowing disabled) is UNSCHEDULABLE_AND_UNRESOLVABLE; one that
reclaim or departures may lift is UNSCHEDULABLE. Reserve then checks the exact charge of the GPUs chosen.
A move's question (Phase.MOVE) is not charged: the claim holds its share, and its queue counts it, already.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from gpupool.core.queues import Quota, Refused, admit, charge_of_allocation, charge_of_request
from gpupool.scheduler.framework.cycle import CycleState, NodeSet, Phase
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import SUCCESS, Code, Status, unschedulable
from gpupool.scheduler.queues import QueueCache, namespace_of


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class QueueAdmission:
    name: ClassVar[str] = "queue_admission"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle

    @property
    def cache(self) -> QueueCache | None:
        cache = self.handle.queues
        return cache if cache is not None and cache.enabled else None

    def decide(self, cycle: CycleState, charge: Quota) -> Refused | None:
        cache = self.cache
        if cache is None or cycle.phase is Phase.MOVE:
            return None
        queue = cache.queue_of(namespace_of(cycle.key))
        decision = admit(cache.queues.tree, cache.usage(without=cycle.holder), queue, charge)
        return decision if isinstance(decision, Refused) else None

    def filter(self, cycle: CycleState, nodes: NodeSet) -> None:
        cache = self.cache
        if cache is None or cycle.request is None:
            return
        refused = self.decide(cycle, charge_of_request(cycle.request.gpu, cache.largest_gpu_mib()))
        if refused is not None:
            code = Code.UNSCHEDULABLE_AND_UNRESOLVABLE if refused.final else Code.UNSCHEDULABLE
            nodes.reject_all(refused.reason, code)

    def reserved(self, cycle: CycleState, node: str) -> bool:
        return False  # holds nothing of its own

    def reserve(self, cycle: CycleState, node: str) -> Status:
        cache = self.cache
        if cache is None or cycle.allocation is None:
            return SUCCESS
        refused = self.decide(cycle, charge_of_allocation(cycle.allocation, cache.gpu_memory()))
        return SUCCESS if refused is None else unschedulable(refused.reason)
