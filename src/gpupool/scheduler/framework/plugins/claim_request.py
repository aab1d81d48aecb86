"""PreFilter `claim_request` (the claim profile, in place of `gpu_request`): what a gated pod's DRA claim
asks, as the request every later plugin reads, so that a claim meets the same rules as a pod asking for the
same share through `gpupool.io/*` limits.

The request is the pod's own (its CPU, memory and `gpupool.io/policy`, read as for any pod:
gpupool.api.pod) with the claim's GPU share in place of any GPU of its own: `count` GPUs with `cores` (at
least 1 milli-GPU: a memory-only share) and `memory`, or whole GPUs when the claim asks no memory (the
request policy's default, as a pod asking `gpupool.io/gpu` alone). Its memory grows by what the class's
memory oversubscription may spill into the node's memory, which must have it beside the pod's. The
isolation is the claim's DeviceClass's. A class config gpupool cannot read is
UNSCHEDULABLE_AND_UNRESOLVABLE with the reason.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from gpupool.api.dra import ClaimError, class_oversubscription, oversub_mib
from gpupool.api.pod import ParsedPod, parse_pod, pod_key
from gpupool.core.model import MILLI_PER_GPU, GPURequest, PodRequest
from gpupool.core.policies import UnknownPolicy
from gpupool.scheduler.framework.cycle import CycleState
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import SKIP, SUCCESS, Status, unresolvable


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ClaimRequest:
    name: ClassVar[str] = "claim_request"
    gpu_only: ClassVar[bool] = False

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle

    def pre_filter(self, cycle: CycleState) -> Status:
        claim = cycle.claim
        if claim is None:
            return SKIP  # not a claim's cycle: nothing asked of gpupool's devices
        try:
            claim.spill_factor = class_oversubscription(claim.config, claim.key)
        except ClaimError as e:
            return unresolvable(str(e))
        ask = claim.ask
        parsed = parse_pod(cycle.pod).request or PodRequest(key=pod_key(cycle.pod))
        whole = ask.memory_mib is None
        gpu = GPURequest(count=ask.count, milli=MILLI_PER_GPU if whole else max(1, ask.cores * 10),
                         memory_mib=None if whole else ask.memory_mib, runtime=parsed.gpu.runtime,
                         isolation=claim.isolation)
        spill = 0 if ask.memory_mib is None else ask.count * oversub_mib(ask.memory_mib, claim.spill_factor)
        request = replace(parsed, memory_mib=parsed.memory_mib + spill, gpu=gpu)
        problems = request.problems()
        if problems:
            return unresolvable(f"claim {claim.key}: invalid request: " + "; ".join(problems))
        try:
            policy = self.handle.policy(request)
        except UnknownPolicy as e:
            return unresolvable(f"claim {claim.key}: invalid request: {e}")
        cycle.parsed = ParsedPod(request=request, isolation=claim.isolation)
        cycle.request, cycle.policy = request, policy
        return SUCCESS
