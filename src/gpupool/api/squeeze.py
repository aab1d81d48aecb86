"""Time-sharing instead of eviction: the annotations by which the scheduler squeezes a borrowed share's
compute back (reclaim, docs/queues.md) and the node agent enforces it through the interception library.

- `gpupool.io/squeezed` (written by the scheduler only): the time the pod was squeezed. While it is there,
  the pod's `gpupool.io/allocation` grants hold less compute than its spec asks (the squeezed cores); the
  agent lowers the library's compute cap to those cores. The scheduler lifts a squeeze by writing the
  grants back to what the spec asks (never from anything stored on the pod) and removing this key.
- `gpupool.io/squeeze: "false"` (written by the pod's owner): never squeeze this pod, evict it instead
  (for work that would rather restart elsewhere than run slower).
- `gpupool.io/room-made` (written by the scheduler on the pending pod a squeeze made room for): see below.

Only pods whose allocation says isolation `hook` and holds one container's grant (allocation version 1)
are squeezed: the library is what enforces the lower cap, and a per-container split is not rewritten. And
only pods the agent has served (`gpupool.io/allocated`): the cap in a container's environment is fixed at
Allocate, so a pod started while squeezed would keep the squeezed cap after the lift.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.api.allocation import AllocationDoc, AllocationError, decode_allocation
from gpupool.api.isolation import IsolationMode
from gpupool.api.names import ANN_ALLOCATED, ANN_ALLOCATION, DOMAIN

ANN_SQUEEZED = f"{DOMAIN}/squeezed"
ANN_SQUEEZE = f"{DOMAIN}/squeeze"
# Set by the scheduler on the pod a squeeze made room for ("<time> #<n>: squeezed <pods>", a new value each
# time): the update is what tells
# kube-scheduler to try the pending pod again now (an eviction does that by deleting a pod; a squeeze only
# changes other pods' annotations, which kube-scheduler does not watch for).
ANN_ROOM_MADE = f"{DOMAIN}/room-made"
SQUEEZE_ISOLATION = IsolationMode.HOOK.value


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def is_squeezed(pod: Mapping[str, Any]) -> bool:
    return ANN_SQUEEZED in _annotations(pod)


def opted_out(pod: Mapping[str, Any]) -> bool:
    return str(_annotations(pod).get(ANN_SQUEEZE, "true")).strip().lower() == "false"


def squeezable_doc(pod: Mapping[str, Any]) -> AllocationDoc | None:
    """The pod's allocation when the scheduler may squeeze it (isolation hook, one container's grant, served
    by the agent, not opted out), else None."""
    text = _annotations(pod).get(ANN_ALLOCATION)
    if not text or opted_out(pod) or ANN_ALLOCATED not in _annotations(pod):
        return None
    try:
        doc = decode_allocation(str(text))
    except AllocationError:
        return None
    if doc.isolation != SQUEEZE_ISOLATION or doc.containers:
        return None
    return doc


def with_cores(doc: AllocationDoc, cores_by_uuid: Mapping[str, float]) -> str:
    """The allocation annotation text with the compute of the named GPUs set to the given percent."""
    gpus = [g.model_copy(update={"cores": cores_by_uuid.get(g.uuid, g.cores)}) for g in doc.gpus]
    return doc.model_copy(update={"gpus": gpus}).model_dump_json(exclude_none=True, exclude={"containers"})


def squeezed_cores(pod: Mapping[str, Any]) -> dict[str, float]:
    """For a squeezed pod: the compute cap (percent) of each of its GPUs by UUID, as its allocation now
    grants it; {} when the pod is not squeezed (or its allocation cannot be read)."""
    if not is_squeezed(pod):
        return {}
    text = _annotations(pod).get(ANN_ALLOCATION)
    if not text:
        return {}
    try:
        doc = decode_allocation(str(text))
    except AllocationError:
        return {}
    return {g.uuid: g.cores for g in doc.gpus}
