"""Reserve / Unreserve `claim_reserve` (the claim profile, where `nominate` serves pods): the claim's share
on the chosen node, assumed in the ledger under the claim's UID until the watch shows the allocation the
claim allocator writes (or `assume_timeout_s` passes).

The GPUs are the ones a pod of the same request would get there (gpupool.scheduler.framework.choice). The
ledger holds the GPU share and what memory oversubscription may take of the node's memory (as
gpupool.api.dra.counted_claim counts a claim), not the pod's CPU or memory: those are kube-scheduler's to
count on the pod's node. The ledger refuses anything over capacity or over a GPU's pod limit.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from gpupool.api.dra import oversub_mib
from gpupool.api.isolation import IsolationMode
from gpupool.scheduler.framework.choice import gpus_on
from gpupool.scheduler.framework.cycle import CycleState
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import SUCCESS, Status, unschedulable


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ClaimReserve:
    name: ClassVar[str] = "claim_reserve"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle

    def reserved(self, cycle: CycleState, node: str) -> bool:
        entry = self.handle.ledger.entries.get(cycle.holder)
        return cycle.claim is not None and entry is not None and entry.allocation.node == node

    def reserve(self, cycle: CycleState, node: str) -> Status:
        claim, request = cycle.claim, cycle.request
        if claim is None or request is None:
            return SUCCESS
        h = self.handle
        allocation = gpus_on(h.ledger.state, h.context(), cycle, node)
        if allocation is None:
            return unschedulable(f"claim {claim.key} does not fit on {node}")
        held = replace(request, key=claim.uid, cpu_milli=0,
                       memory_mib=sum(oversub_mib(g.memory_mib, claim.spill_factor) for g in allocation.grants))
        refused = h.ledger.assume(claim.uid, claim.key, held, replace(allocation, pod=claim.uid),
                                  h.clock() + h.config.assume_timeout_s,
                                  mps=cycle.parsed is not None and cycle.parsed.isolation == IsolationMode.MPS,
                                  claim=True)
        if refused is not None:
            return unschedulable(f"claim {claim.key}: {refused}")
        cycle.allocation = h.ledger.entries[claim.uid].allocation
        return SUCCESS

    async def unreserve(self, cycle: CycleState, node: str) -> None:
        if cycle.claim is not None:
            self.handle.ledger.forget(cycle.claim.uid)
