"""Whether a pod still waits for its device allocation. The scheduler and the node agent must read this the
same way: the scheduler binds at most one such GPU pod per node (gpupool.scheduler.busy), and the agent
takes kubelet's Allocate to be for the only such pod (gpupool.agent.identify)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.api.allocation import AllocationDoc, AllocationError, decode_allocation
from gpupool.api.names import ANN_ALLOCATED, ANN_ALLOCATION

# A Running pod has had all its Allocate calls (kubelet starts containers only after them); a finished one
# needs none.
_DONE_PHASES = frozenset({"Running", "Succeeded", "Failed"})


def awaits_allocate(pod: Mapping[str, Any]) -> bool:
    """Not Running or finished, not being deleted, and not yet marked `gpupool.io/allocated` (the agent
    marks a pod once its last GPU container is served)."""
    meta = pod.get("metadata") or {}
    return (
        (pod.get("status") or {}).get("phase") not in _DONE_PHASES
        and not meta.get("deletionTimestamp")
        and ANN_ALLOCATED not in (meta.get("annotations") or {})
    )


def waiting_for_allocate(pod: Mapping[str, Any], node_name: str) -> AllocationDoc | None:
    """The allocation of a pod bound to `node_name` that still waits for its Allocate, when it has a
    readable one written for that node; else None."""
    if (pod.get("spec") or {}).get("nodeName") != node_name or not awaits_allocate(pod):
        return None
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_ALLOCATION)
    if text is None:
        return None
    try:
        doc = decode_allocation(text)
    except AllocationError:
        return None
    return doc if doc.node == node_name else None
