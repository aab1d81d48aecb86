"""Which pod is kubelet's Allocate call for? Decided from API objects and the agent's own checkpoint only,
and never by guessing.

Kubelet's Allocate carries device IDs but no pod identity. The scheduler writes the pod's
`gpupool.io/allocation` before it binds the pod here, and binds at most one GPU pod per node between a bind
and that pod's Allocate (gpupool.scheduler: a pod waits from its bind until it runs, finishes, is deleted or
carries `gpupool.io/allocated`). That spacing only keeps nodes from being refused needlessly; it is not what
makes the answer right: the scheduler may go on after a timeout, and a pod bound with `spec.nodeName`
never asked it. What makes it right is that the call can only be for a *candidate*: a pod bound to this
node, not finished and not being deleted, with a container asking for exactly as many gpupool.io/gpu as
kubelet sends, that either still waits for its Allocate (not Running, no `gpupool.io/allocated` marker) or
was answered these very device IDs before (the checkpoint: kubelet repeats a call after its own restart).
Kubelet only calls Allocate for a pod it is admitting, so when exactly one candidate exists the call is
for it. Then:

- no candidate → refused: no pod the API shows on this node can be the subject of this call;
- two or more candidates → refused as ambiguous, naming them: a pod still waiting after the scheduler
  went on past its timeout, or a GPU pod without an allocation (bound with `spec.nodeName`, bypassing the
  scheduler), could be the subject of this call as well as the other;
- the only candidate, answered these devices before and no longer waiting → a *repeat*: the same answer
  again;
- the only candidate, still waiting (its first call, the call of its next GPU container, or kubelet
  asking again for one while others still wait) → served when every check holds:
  1. it exists on this node, is not finished, and has not already been served (no
     `gpupool.io/allocated` marker);
  2. its allocation annotation is readable, is for this node and for this pod UID;
  3. it has a container asking for gpupool.io/gpu, and when several do, its allocation (version 2) says
     which container holds what;
  (a still-waiting repeat that fails them is answered as a repeat only: the checkpointed answer again);
- else the Allocate fails with the reason (the pod fails admission and its controller recreates it, which
  is better than a container running with another pod's share).

Which container of the pod (`which_container`): kubelet calls Allocate once per container that asks for
gpupool.io/gpu, init containers first, then app containers, each in spec order, and it asks for the next
container only after it checkpointed the answer for the previous one. So a call is either for the first
GPU container the agent has not served yet, or a repeat of the *last* one it served (kubelet restarted
before it checkpointed that answer). Kubelet hands the devices of a plain init container (not of a sidecar
or an app container) to the containers after it, so the next container may come with the same device IDs
as that init container. So while a pod has served and unserved GPU containers, kubelet's own checkpoint
tells which (gpupool.agent.kubelet.kubelet_checkpoint): the last served container recorded there → the next
container; not recorded → kubelet asking for the last one again. Where that checkpoint cannot be read, the
device IDs decide: the last container's IDs again → a repeat, other IDs → the next container, and an init
container's IDs that the next container could take → refused as ambiguous.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.allocation import AllocationDoc, AllocationError, decode_allocation
from gpupool.api.names import ANN_ALLOCATED, ANN_ALLOCATION, RESOURCE_GPU
from gpupool.api.pod import INIT, containers, gpu_count, pod_annotations, pod_key
from gpupool.api.quantity import QuantityError
from gpupool.api.waiting import awaits_allocate, waiting_for_allocate

# ANN_ALLOCATED: the pod annotation the agent writes once it served the pod's Allocate (JSON: node,
# time, devices). It tells a restarted agent, the scheduler (which then binds the node's next GPU pod) and
# the candidate rule which pods are no longer waiting.

Obj = Mapping[str, Any]
_FINISHED = {"Succeeded", "Failed"}


@dataclass(frozen=True, slots=True)
class Identified:
    namespace: str
    name: str
    uid: str
    allocation: AllocationDoc
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


@dataclass(frozen=True, slots=True)
class GpuContainer:
    name: str
    count: int  # its gpupool.io/gpu limit (-1 when unreadable)
    reusable: bool  # a plain init container: kubelet may hand its devices to the containers after it


@dataclass(frozen=True, slots=True)
class NextContainer:
    """Serve this container now."""

    container: GpuContainer


@dataclass(frozen=True, slots=True)
class Again:
    """Kubelet repeats the call of this container, served before: answer the same."""

    container: str


def gpu_containers(pod: Obj) -> list[GpuContainer]:
    """Every container asking for GPUs, in the order kubelet calls Allocate for them: init containers
    first, then app containers, each in spec order (read by the one pod reader, gpupool.api.pod, so that
    a count means here what it means to the scheduler)."""
    out: list[GpuContainer] = []
    for c in containers(pod):
        try:
            count = gpu_count(c)
        except QuantityError:
            count = -1  # unreadable: no Allocate is for it
        if count:  # None: asks for no GPU; 0 GPUs: kubelet makes no Allocate call
            out.append(GpuContainer(c.name, count, reusable=c.kind == INIT))  # a sidecar keeps its devices
    return out


def by_container(containers: list[GpuContainer], served: Mapping[str, Any]) -> dict[str, Any]:
    """`served` keyed by container name. An entry under "" (checkpoint version 1, written when the agent
    served one GPU container per pod) stands for the pod's only GPU container."""
    if "" in served and len(containers) == 1:
        return {containers[0].name: served[""], **{k: v for k, v in served.items() if k}}
    return {k: v for k, v in served.items() if k}


def _unknown() -> str:
    return "kubelet's checkpoint was not consulted"


def which_container(
    label: str,
    containers: list[GpuContainer],
    served: Mapping[str, tuple[str, ...]],
    ids: Collection[str],
    kubelet_recorded: Callable[[], set[str] | str] = _unknown,
) -> NextContainer | Again | Unidentified:
    """Which GPU container of pod `label` this call with device IDs `ids` is for, given the device IDs the
    agent answered each served container (`served`, by container name; see the module's docstring).
    `kubelet_recorded` gives the pod's containers kubelet's checkpoint records (or why it cannot); it is
    asked while the pod has both a served and an unserved GPU container: kubelet asks for the next one
    only after it recorded the last one, so whether it recorded the last one decides."""
    served = by_container(containers, served)
    wanted = tuple(sorted(ids))
    done = [c for c in containers if c.name in served]
    last = done[-1] if done else None
    nxt = next((c for c in containers if c.name not in served), None)
    if last is not None and nxt is not None:
        recorded = kubelet_recorded()
        if not isinstance(recorded, str):
            if last.name in recorded:
                return _next(label, nxt, wanted)
            if served[last.name] == wanted:
                return Again(last.name)
            return Unidentified(
                f"kubelet asks again for container {last.name} of pod {label} (its checkpoint does not record "
                f"the answer), with device IDs {list(wanted)} instead of the {list(served[last.name])} it was "
                "answered; refusing rather than giving it another container's grant"
            )
        # kubelet's checkpoint unreadable: the device IDs decide where they can
        if served[last.name] == wanted and nxt.count == len(wanted) and last.reusable:
            return Unidentified(
                f"ambiguous: this call with the device IDs of init container {last.name} of pod {label} is "
                f"either kubelet asking for {last.name} again or the first call for {nxt.name}, and kubelet's "
                f"checkpoint cannot tell: {recorded}"
            )
    if last is not None and served[last.name] == wanted:
        return Again(last.name)
    if nxt is None:
        names = ", ".join(c.name for c in containers)
        return Unidentified(
            f"every GPU container of pod {label} ({names}) has been served, and none was answered the device IDs "
            f"{list(wanted)} of this call (kubelet picked other devices for a container it asked for before?)"
        )
    return _next(label, nxt, wanted)


def _next(label: str, nxt: GpuContainer, wanted: tuple[str, ...]) -> NextContainer | Unidentified:
    if nxt.count != len(wanted):
        return Unidentified(
            f"kubelet asks for {len(wanted)} device(s) but the next GPU container of pod {label}, {nxt.name}, "
            f"asks for {nxt.count}: the call is not for this pod"
        )
    return NextContainer(nxt)


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
    if all(c.count != device_count for c in gpu_containers(pod)):
        return False  # kubelet sends exactly one container's gpupool.io/gpu limit
    return _meta(pod).get("uid") in answered or awaits_allocate(pod)


def _describe(pod: Obj, node_name: str, answered: Collection[str]) -> str:
    if _meta(pod).get("uid") in answered:
        return f"{pod_key(pod)} (was answered these devices before)"
    if waiting_for_allocate(pod, node_name) is None:
        return (f"{pod_key(pod)} (a GPU pod without a {ANN_ALLOCATION} for this node: bound without gpupool's "
                "scheduler?)")
    return pod_key(pod)


def identify(
    pods: Iterable[Obj], node_name: str, device_count: int, answered: Collection[str] = ()
) -> Identified | Repeat | Unidentified:
    """Which pod this Allocate of `device_count` devices is for: the only candidate, or none (see the
    module's docstring). `answered`: UIDs of the pods the agent's checkpoint says were answered exactly the
    device IDs of this call."""
    pods = list(pods)
    candidates = [p for p in pods if is_candidate(p, node_name, device_count, answered)]
    if not candidates:
        return Unidentified(_no_candidate(pods, node_name, device_count))
    if len(candidates) > 1:
        # Kubelet admits one of them, and nothing in the call says which: any answer could hand one pod
        # another's share.
        names = ", ".join(sorted(_describe(p, node_name, answered) for p in candidates))
        return Unidentified(
            f"ambiguous: {names} could each be the pod this Allocate of {device_count} device(s) on {node_name} is "
            "for; refusing to guess"
        )
    (only,) = candidates
    meta = _meta(only)
    repeat = Repeat(meta.get("namespace", "default"), meta.get("name", "?"), meta.get("uid", ""))
    if meta.get("uid") in answered and not awaits_allocate(only):
        return repeat  # served already: only the checkpointed answers may be given again
    checked = _check(only, node_name)
    if isinstance(checked, Unidentified) and meta.get("uid") in answered:
        # these very devices were answered for it: the same answer again is still right, but no new
        # container is served from an allocation that no longer passes the checks
        return repeat
    return checked  # still waiting: its first call, or one of several GPU containers (which_container decides)


def _no_candidate(pods: list[Obj], node_name: str, device_count: int) -> str:
    others = [
        f"{pod_key(p)} asks for {', '.join(str(c.count) for c in gpu_containers(p))}"
        for p in pods
        if is_alive_on(p, node_name) and awaits_allocate(p) and gpu_containers(p)
    ]
    waiting = f" (pods waiting here for other counts: {'; '.join(sorted(others))})" if others else ""
    return (
        f"no pod bound to node {node_name} waits for an Allocate of {device_count} device(s), nor was one "
        f"answered these device IDs before{waiting}: the API shows no pod here this call can be for (a served "
        "pod asked for again with other device IDs, a pod deleted meanwhile, or the agent's checkpoint lost); "
        "not guessing which pod it is"
    )


def _check(pod: Obj, node_name: str) -> Identified | Unidentified:
    """The only candidate, served when it passes checks 1-3 of the module's docstring."""
    meta = _meta(pod)
    uid = str(meta.get("uid", ""))
    label = f"{pod_key(pod)} (uid {uid})"
    if not is_alive_on(pod, node_name):
        return Unidentified(f"pod {label} is not alive on node {node_name}")
    annotations = pod_annotations(pod)
    if ANN_ALLOCATED in annotations:
        return Unidentified(f"pod {label} was already served ({ANN_ALLOCATED} is set)")
    if ANN_ALLOCATION not in annotations:
        return Unidentified(
            f"pod {label} has no {ANN_ALLOCATION} annotation: a GPU pod bound without gpupool's scheduler "
            "(check its schedulerName)?"
        )
    try:
        doc = decode_allocation(annotations[ANN_ALLOCATION])
    except AllocationError as e:
        return Unidentified(f"pod {label}: {e}")
    if doc.node != node_name:
        return Unidentified(f"pod {label}: its {ANN_ALLOCATION} is for node {doc.node!r}, not {node_name}")
    if doc.pod_uid and doc.pod_uid != uid:
        return Unidentified(f"pod {label}: its allocation was written for pod uid {doc.pod_uid}")
    containers = gpu_containers(pod)
    if not containers:
        return Unidentified(f"pod {label} has no container asking for {RESOURCE_GPU}")
    if len(containers) > 1:
        if not doc.containers:  # version 1 would hand every container the pod's whole grant
            return Unidentified(
                f"pod {label} has {len(containers)} containers asking for {RESOURCE_GPU} "
                f"({', '.join(c.name for c in containers)}), but its {ANN_ALLOCATION} (version {doc.version}) "
                "does not say which container holds which GPUs"
            )
        missing = [c.name for c in containers if not doc.container_gpus(c.name)]
        if missing:
            return Unidentified(
                f"pod {label} has {len(containers)} containers asking for {RESOURCE_GPU}, but its "
                f"{ANN_ALLOCATION} (version {doc.version}) gives no GPUs to {', '.join(missing)}"
            )
    namespace = str(meta.get("namespace", "default"))
    return Identified(namespace, str(meta.get("name", "?")), uid, doc, meta.get("resourceVersion"))


def allocated_marker(node_name: str, devices: Iterable[str], time: str) -> str:
    """The `gpupool.io/allocated` text: `devices` are those of all the pod's GPU containers (each once)."""
    return json.dumps({"node": node_name, "time": time, "devices": sorted(set(devices))}, separators=(",", ":"))
