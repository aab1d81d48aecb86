"""Which pod is kubelet's Allocate call for? Decided from API objects and the agent's own checkpoint only,
and never by guessing.

Kubelet's Allocate carries device IDs but no pod identity. The scheduler takes the node's bind lock
(`gpupool.io/bind-lock`, gpupool.api.lock) naming the pod before it binds it here, and writes the pod's
`gpupool.io/allocation`. The call can only be for a *candidate*: a pod bound to this node, not finished
and not being deleted, with a container asking for exactly as many gpupool.io/gpu as kubelet sends, that
either still waits for its Allocate (not Running, no `gpupool.io/allocated` marker) or was answered these
very device IDs before (the checkpoint: kubelet repeats a call after its own restart). Then:

- exactly one candidate, answered these devices before → a *repeat*: the same answer again;
- otherwise the lock holder, when every check below holds and it is the only candidate:
  1. the node carries a readable bind lock;
  2. the pod it names exists on this node with the same UID, is not finished, and has not already been
     served (no `gpupool.io/allocated` marker);
  3. its allocation annotation is readable, is for this node and for this pod UID;
  4. exactly one of its containers asks for gpupool.io/gpu, and kubelet asks for as many devices as the
     allocation grants;
  5. no *other* candidate: a pod whose lock was taken over after its timeout while its Allocate was still
     pending, or a GPU pod without an allocation (bound with `spec.nodeName`, bypassing the scheduler),
     could be the subject of this call as well as the lock holder;
- else the Allocate fails with the reason (the pod fails admission and its controller recreates it, which
  is better than a container running with another pod's share).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.allocation import AllocationDoc, AllocationError, decode_allocation
from gpupool.api.lock import ANN_BIND_LOCK, BindLock, LockError, decode_lock
from gpupool.api.names import ANN_ALLOCATED, ANN_ALLOCATION, RESOURCE_GPU

# ANN_ALLOCATED: the pod annotation the agent writes once it served the pod's Allocate (JSON: node,
# time, devices). It tells a restarted agent, and check 5, which pods are no longer waiting.

Obj = Mapping[str, Any]
# A Running pod has had all its Allocate calls; a finished one needs none.
_NOT_WAITING = {"Running", "Succeeded", "Failed"}
_FINISHED = {"Succeeded", "Failed"}


@dataclass(frozen=True, slots=True)
class Identified:
    namespace: str
    name: str
    uid: str
    allocation: AllocationDoc
    lock: BindLock
    resource_version: str | None = None  # of the pod as read: the marker write is conditional on it


@dataclass(frozen=True, slots=True)
class Repeat:
    """Kubelet asks again for devices the agent already answered for this pod: answer the same."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Unidentified:
    reason: str


def _meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _annotations(obj: Obj) -> Mapping[str, str]:
    return _meta(obj).get("annotations") or {}


def _label(pod: Obj) -> str:
    m = _meta(pod)
    return f"{m.get('namespace', 'default')}/{m.get('name', '?')}"


def gpu_containers(pod: Obj) -> list[tuple[str, int]]:
    """(container name, gpupool.io/gpu limit) of every container, init ones included, that asks for GPUs."""
    spec = pod.get("spec") or {}
    out: list[tuple[str, int]] = []
    for c in list(spec.get("initContainers") or []) + list(spec.get("containers") or []):
        res = c.get("resources") or {}
        value = (res.get("limits") or {}).get(RESOURCE_GPU, (res.get("requests") or {}).get(RESOURCE_GPU))
        if value is None:
            continue
        try:
            count = int(str(value))
        except ValueError:
            count = -1
        if count != 0:
            out.append((str(c.get("name", "?")), count))
    return out


def waiting_for_allocate(pod: Obj, node_name: str) -> AllocationDoc | None:
    """The allocation of a pod bound to this node whose Allocate has not been served yet, else None."""
    if (pod.get("spec") or {}).get("nodeName") != node_name:
        return None
    if (pod.get("status") or {}).get("phase") in _NOT_WAITING or _meta(pod).get("deletionTimestamp"):
        return None
    annotations = _annotations(pod)
    if ANN_ALLOCATED in annotations or ANN_ALLOCATION not in annotations:
        return None
    try:
        doc = decode_allocation(annotations[ANN_ALLOCATION])
    except AllocationError:
        return None
    return doc if doc.node == node_name else None


def read_lock(node: Obj) -> BindLock | Unidentified:
    text = _annotations(node).get(ANN_BIND_LOCK)
    name = _meta(node).get("name", "?")
    if not text:
        return Unidentified(
            f"node {name} has no {ANN_BIND_LOCK}: the scheduler writes it when it binds a GPU pod here, so this "
            "Allocate is for a pod gpupool did not schedule (check the pod's schedulerName) or whose lock was "
            "already used; not guessing which pod it is"
        )
    try:
        return decode_lock(text)
    except LockError as e:
        return Unidentified(f"node {name}: {e}")


def is_alive_on(pod: Obj, node_name: str) -> bool:
    """Bound to this node, not finished, not being deleted: kubelet may still hold devices for it."""
    return (
        (pod.get("spec") or {}).get("nodeName") == node_name
        and (pod.get("status") or {}).get("phase") not in _FINISHED
        and not _meta(pod).get("deletionTimestamp")
    )


def is_candidate(pod: Obj, node_name: str, device_count: int, answered: Collection[str] = ()) -> bool:
    """Could kubelet's Allocate of `device_count` devices be for this pod? `answered` holds the UIDs of pods
    the agent answered these exact device IDs before."""
    if not is_alive_on(pod, node_name):
        return False
    if all(count != device_count for _, count in gpu_containers(pod)):
        return False  # kubelet sends exactly one container's gpupool.io/gpu limit
    if _meta(pod).get("uid") in answered:
        return True
    return (pod.get("status") or {}).get("phase") != "Running" and ANN_ALLOCATED not in _annotations(pod)


def _describe(pod: Obj, node_name: str, answered: Collection[str]) -> str:
    if _meta(pod).get("uid") in answered:
        return f"{_label(pod)} (was answered these devices before)"
    if waiting_for_allocate(pod, node_name) is None:
        return f"{_label(pod)} (a GPU pod without a {ANN_ALLOCATION} for this node: bound without gpupool's scheduler?)"
    return _label(pod)


def identify(
    node: Obj, pods: Iterable[Obj], node_name: str, device_count: int, answered: Collection[str] = ()
) -> Identified | Repeat | Unidentified:
    """Which pod this Allocate of `device_count` devices is for. `answered`: UIDs of the pods the agent's
    checkpoint says were answered exactly the device IDs of this call."""
    pods = list(pods)
    candidates = [p for p in pods if is_candidate(p, node_name, device_count, answered)]
    repeats = [p for p in candidates if _meta(p).get("uid") in answered]
    if len(repeats) == 1 and len(candidates) == 1:
        meta = _meta(repeats[0])
        return Repeat(meta.get("namespace", "default"), meta.get("name", "?"), meta.get("uid", ""))
    if repeats:
        names = ", ".join(sorted(_describe(p, node_name, answered) for p in candidates))
        return Unidentified(
            f"ambiguous: {names} could each be the pod this Allocate of {device_count} device(s) on {node_name} is "
            "for; refusing to guess"
        )
    holder = _lock_holder(node, pods, node_name, device_count)
    if isinstance(holder, Unidentified):
        return holder
    if all(_meta(p).get("uid") != holder.uid for p in candidates):
        holder_pod = next(p for p in pods if _meta(p).get("uid") == holder.uid)
        limits = ", ".join(str(n) for _, n in gpu_containers(holder_pod))
        return Unidentified(
            f"kubelet asks for {device_count} device(s) but the GPU container of pod {holder.namespace}/{holder.name} "
            f"asks for {limits}: the call is not for the pod holding the bind lock"
        )
    rivals = [_describe(p, node_name, answered) for p in candidates if _meta(p).get("uid") != holder.uid]
    if rivals:
        return Unidentified(
            f"ambiguous: pod {holder.namespace}/{holder.name} (uid {holder.uid}) holds the bind lock, but "
            f"{', '.join(sorted(rivals))} also wait(s) for an Allocate of {device_count} device(s) on {node_name}; "
            "refusing to guess which pod this call is for"
        )
    return holder


def _lock_holder(node: Obj, pods: list[Obj], node_name: str, device_count: int) -> Identified | Unidentified:
    """The pod the bind lock names, if it passes checks 1-4."""
    lock = read_lock(node)
    if isinstance(lock, Unidentified):
        return lock
    holder_label = f"{lock.namespace}/{lock.name} (uid {lock.pod_uid})"
    holder = next((p for p in pods if _meta(p).get("uid") == lock.pod_uid), None)
    if holder is None:
        return Unidentified(f"the bind lock names pod {holder_label}, which is not on node {node_name}")
    if (_meta(holder).get("namespace"), _meta(holder).get("name")) != (lock.namespace, lock.name):
        return Unidentified(f"the bind lock names {holder_label} but that UID belongs to {_label(holder)}")
    annotations = _annotations(holder)
    if ANN_ALLOCATED in annotations:
        return Unidentified(
            f"pod {holder_label} named by the bind lock was already served ({ANN_ALLOCATED} is set); "
            "this Allocate is for a pod whose lock is missing"
        )
    if ANN_ALLOCATION not in annotations:
        return Unidentified(f"pod {holder_label} has no {ANN_ALLOCATION} annotation")
    try:
        doc = decode_allocation(annotations[ANN_ALLOCATION])
    except AllocationError as e:
        return Unidentified(f"pod {holder_label}: {e}")
    if waiting_for_allocate(holder, node_name) is None:
        return Unidentified(
            f"pod {holder_label} is not waiting for an Allocate on {node_name} "
            f"(allocation for node {doc.node!r}, phase {(holder.get('status') or {}).get('phase')!r})"
        )
    if doc.pod_uid and doc.pod_uid != lock.pod_uid:
        return Unidentified(f"pod {holder_label}: its allocation was written for pod uid {doc.pod_uid}")
    containers = gpu_containers(holder)
    if len(containers) != 1:
        names = ", ".join(n for n, _ in containers) or "none"
        return Unidentified(
            f"pod {holder_label} has {len(containers)} containers asking for {RESOURCE_GPU} ({names}); "
            "the agent supports exactly one GPU container per pod"
        )
    if device_count != len(doc.gpus):
        return Unidentified(
            f"kubelet asks for {device_count} device(s) but pod {holder_label} was granted {len(doc.gpus)} GPU(s): "
            "the call is not for the pod holding the bind lock"
        )
    return Identified(lock.namespace, lock.name, lock.pod_uid, doc, lock, _meta(holder).get("resourceVersion"))


def allocated_marker(node_name: str, devices: list[str], time: str) -> str:
    return json.dumps({"node": node_name, "time": time, "devices": devices}, separators=(",", ":"))
