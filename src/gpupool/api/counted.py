"""What a pod holds according to the API objects: the one reader of a pod's granted GPU shares for every
service (the scheduler's ledger and its recomputation, the binding plugin, the test harness).

Truth lives in the API server: a pod *counts* when it is bound (spec.nodeName), not terminal, and carries a
`gpupool.io/allocation` annotation written for its own UID and node (`counted_allocation`). `beyond_spec`
says when what it holds is not what its own spec asks (state forged through the API shows so).

The limits on how many pods share one GPU are API facts too: a node's inventory says its `split`
(DEFAULT_SPLIT when it says none), and an MPS control daemon serves at most MPS_CLIENTS_PER_GPU clients.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpupool.api.allocation import AllocationError, decode_allocation
from gpupool.api.isolation import IsolationMode
from gpupool.api.names import ANN_ALLOCATION
from gpupool.api.pod import parse_pod, pod_key
from gpupool.api.squeeze import is_squeezed
from gpupool.core.mig import mig_model
from gpupool.core.mig_request import ProfileRefusal, grant_share, profile_for
from gpupool.core.model import MILLI_PER_GPU, Allocation, GPUGrant, Node, PodRequest

log = logging.getLogger(__name__)

TERMINAL_PHASES = ("Succeeded", "Failed")
# An MPS control daemon serves at most 48 client processes per GPU (Volta and newer); gpupool counts one
# client per pod (a pod with several CUDA processes needs more, which this limit cannot see).
MPS_CLIENTS_PER_GPU = 48
DEFAULT_SPLIT = 10  # an inventory without `split` (the field's default in gpupool.api.inventory)


@dataclass(frozen=True, slots=True)
class Counted:
    """A pod that holds capacity according to the API objects."""

    uid: str
    key: str
    request: PodRequest
    allocation: Allocation
    mps: bool = False
    spec_errors: tuple[str, ...] = ()  # the pod's own spec could not be read (it asks for nothing valid)
    squeezed: bool = False  # a reclaim lowered its compute (gpupool.api.squeeze): less than its spec is right
    containers: str = ""  # the containers that ask for GPUs, comma-separated (shown in the pool views)
    claim: bool = False  # a DRA ResourceClaim (gpupool.api.dra.counted_claim), not a pod


def grants_signature(a: Allocation) -> tuple[str, tuple[tuple[str, int, int, int, str, int], ...]]:
    return a.node, tuple(sorted((g.uuid, g.index, g.milli, g.memory_mib,
                                 *((g.mig.profile, g.mig.start) if g.mig else ("", -1))) for g in a.grants))


def counted_allocation(pod: Mapping[str, Any]) -> Counted | None:
    """The capacity `pod` holds according to the API, or None."""
    meta = pod.get("metadata") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    text = (meta.get("annotations") or {}).get(ANN_ALLOCATION)
    if not node or not text or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
        return None
    uid = str(meta.get("uid", ""))
    try:
        doc = decode_allocation(text)
    except AllocationError as e:
        log.warning("pod %s: ignoring allocation annotation: %s", pod_key(pod), e)
        return None
    if doc.pod_uid != uid or doc.node != node:
        # Written for an earlier pod of the same name, or for another node: it grants nothing.
        return None
    parsed = parse_pod(pod)
    request = parsed.request or PodRequest(key=uid)
    mps = parsed.isolation == IsolationMode.MPS
    return Counted(uid, pod_key(pod), replace(request, key=uid), doc.allocation(uid), mps, tuple(parsed.errors),
                   is_squeezed(pod), ",".join(c.name for c in parsed.containers))


def beyond_spec(c: Counted, node: Node) -> str | None:
    """Why the allocation is not what the pod's own spec asks on this node (None: it is exactly that).
    The scheduler grants `count` GPUs of `milli` compute and `memory_on(card)` memory each
    (ClusterState.grants_for); anything else was not decided from the pod."""
    if c.spec_errors:
        return (f"{c.key}: holds {fmt_allocation(c.allocation)} but its spec asks for no valid share "
                f"({'; '.join(c.spec_errors)})")
    g = c.request.gpu
    if len(c.allocation.grants) != g.count:
        return (f"{c.key}: holds {len(c.allocation.grants)} GPU(s) ({fmt_allocation(c.allocation)}), its spec "
                f"asks for {g.count}")
    cards = {gpu.index: gpu for gpu in node.gpus}
    for grant in c.allocation.grants:
        card = cards.get(grant.index)
        if card is None:
            continue  # a grant for a GPU the node does not have: ClusterState.allocate reports it
        if grant.mig is not None:
            unasked = _beyond_mig(c, grant, card.model, node.name)
            if unasked is not None:
                return unasked
            continue
        milli, memory = min(g.milli, MILLI_PER_GPU), g.memory_on(card.memory_mib)
        if (grant.milli != milli and not (c.squeezed and 0 < grant.milli < milli)) or grant.memory_mib != memory:
            return (f"{c.key}: holds {grant.milli / 10:g} percent / {grant.memory_mib} MiB on GPU {grant.index} of "
                    f"{node.name}, its spec asks for {milli / 10:g} percent / {memory} MiB")
    return None


def _beyond_mig(c: Counted, grant: GPUGrant, model_name: str, node: str) -> str | None:
    """A MIG grant records its profile's share (gpupool.core.mig_request.grant_share), and the profile
    must hold what the pod's spec asks (a named profile may be larger than the request)."""
    assert grant.mig is not None
    model = mig_model(model_name)
    profile = model.profile(grant.mig.profile) if model is not None else None
    where = f"GPU {grant.index} of {node}"
    if model is None or profile is None:
        return f"{c.key}: holds MIG {grant.mig.profile} on {where}, a {model_name} has no such profile"
    milli, memory = grant_share(model, profile)
    if (grant.milli, grant.memory_mib) != (milli, memory):
        return (f"{c.key}: holds {grant.milli / 10:g} percent / {grant.memory_mib} MiB on {where}, its MIG "
                f"profile {profile.name} gives {milli / 10:g} percent / {memory} MiB")
    held = profile_for(model, c.request.gpu, profile.name)
    if isinstance(held, ProfileRefusal):
        return f"{c.key}: holds MIG {profile.name} on {where}, which does not hold its spec: {held.reason}"
    return None


def fmt_allocation(a: Allocation) -> str:
    gpus = ",".join(f"{g.index}:{g.milli / 10:g}%/{g.memory_mib}Mi" for g in a.grants)
    return f"{a.node}[{gpus}]"
