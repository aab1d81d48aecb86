"""Device-plugin slot IDs: each GPU is advertised as `split` slots named `<GPU UUID>::<n>`.

Kubelet counts and checkpoints these IDs; the real GPU a pod gets comes from its allocation annotation,
so the slot kubelet picks is only a placeholder (GetPreferredAllocation steers it onto the right GPU so
that kubelet's records and the podresources API name the GPU the pod really uses). IDs are derived only
from the UUID, so they stay the same across agent restarts and kubelet's checkpoint stays valid.
"""

from __future__ import annotations

from dataclasses import dataclass

SEPARATOR = "::"
MAX_ID_LEN = 63  # kubelet's limit on a device ID


def slot_id(uuid: str, n: int) -> str:
    return f"{uuid}{SEPARATOR}{n}"


def slot_gpu(device_id: str) -> str | None:
    """The GPU UUID of a slot ID, or None when the ID is not one of ours."""
    uuid, sep, n = device_id.rpartition(SEPARATOR)
    if not sep or not uuid or not n.isdigit():
        return None
    return uuid


@dataclass(frozen=True, slots=True)
class Slot:
    id: str
    uuid: str
    healthy: bool
    numa_node: int  # -1: unknown, no topology reported


def preferred(available: list[str], must_include: list[str], size: int, gpu_order: list[str]) -> list[str]:
    """Choose `size` slot IDs: the must-include ones first, then one free slot on each GPU of `gpu_order`
    (the GPUs the scheduler chose, in order), then further slots of those GPUs, then anything else."""
    chosen: list[str] = []
    for d in must_include:
        if d not in chosen and len(chosen) < size:
            chosen.append(d)
    free = [d for d in available if d not in chosen]
    by_gpu: dict[str, list[str]] = {}
    for d in free:
        by_gpu.setdefault(slot_gpu(d) or "", []).append(d)
    taken_gpus = {slot_gpu(d) for d in chosen}
    rounds = [u for u in gpu_order if u not in taken_gpus] + [u for u in gpu_order if u in taken_gpus]
    for uuid in rounds + gpu_order:
        if len(chosen) >= size:
            break
        if by_gpu.get(uuid):
            chosen.append(by_gpu[uuid].pop(0))
    for d in free:
        if len(chosen) >= size:
            break
        if d not in chosen:
            chosen.append(d)
    return chosen
