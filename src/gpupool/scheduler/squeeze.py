"""Time-sharing instead of eviction, the scheduler's effects (the choice is gpupool.core.preemption's
plan_squeeze; the annotations are gpupool.api.squeeze's):

- squeeze: the pod's `gpupool.io/allocation` grants are rewritten with the lowered compute and
  `gpupool.io/squeezed` is set, in one patch conditional on the pod's resourceVersion; the ledger takes the
  patched pod at once, so the freed compute is there for the pod that reclaimed it (its next cycle). The node
  agent lowers the library's cap to match (gpupool.agent.enforce.squeeze).
- lift (`lift_squeezes`, every queue-status interval on the leader): a squeezed pod gets the compute its spec
  asks back once (a) it was squeezed at least `hold_s` ago, (b) its queue admits it at full size (within its
  guarantee, or borrowing while no pod of another queue is pending), and (c) that compute is free on its GPUs
  again. The capacity is taken in the ledger before the patch is sent, so no other pod is placed on it
  meanwhile; a failed patch gives it back.

A squeezed pod is recognised in the ledger by holding less compute than its spec asks: the allocation
annotation is written by the scheduler only, and it grants less than the spec only when squeezing.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from gpupool.api.allocation import AllocationError, decode_allocation
from gpupool.api.logsafe import shown
from gpupool.api.names import ANN_ALLOCATION
from gpupool.api.squeeze import ANN_SQUEEZED, squeezable_doc, with_cores
from gpupool.api.times import format_time
from gpupool.cluster.port import ApiError, ClusterPort, Conflict, Obj
from gpupool.core.model import MILLI_PER_GPU, Allocation, PodRequest
from gpupool.core.preemption import Share
from gpupool.core.queues import Admitted, admit, charge_of_allocation
from gpupool.scheduler.ledger import Entry, Ledger
from gpupool.scheduler.queues import QueueCache, namespace_of
from gpupool.scheduler.what_if import Snapshot

log = logging.getLogger(__name__)

DEFAULT_HOLD_S = 30.0


def squeezed_allocation(allocation: Allocation, milli: int) -> Allocation:
    """The allocation with each grant's compute lowered to at most `milli`."""
    return replace(allocation, grants=tuple(replace(g, milli=min(g.milli, milli)) for g in allocation.grants))


def full_allocation(entry: Entry) -> Allocation:
    """What the pod's spec asks on its GPUs (what a lift gives back)."""
    milli = min(entry.request.gpu.milli, MILLI_PER_GPU)
    return replace(entry.allocation, grants=tuple(replace(g, milli=milli) for g in entry.allocation.grants))


def is_squeezed_entry(entry: Entry) -> bool:
    milli = min(entry.request.gpu.milli, MILLI_PER_GPU)
    return any(g.milli < milli for g in entry.allocation.grants)


def shares_of(entry: Entry, memory: Mapping[str, int]) -> tuple[Share, ...]:
    return tuple(Share(g.milli, g.memory_mib, memory.get(g.uuid, 0)) for g in entry.allocation.grants)


def can_squeeze(pod: Obj | None) -> bool:
    """Served by the interception library, one container's grant, not opted out, not being deleted."""
    if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return squeezable_doc(pod) is not None


def fits_squeezed(snapshot: Snapshot, request: PodRequest, node: str, squeezes: Mapping[str, int]) -> bool:
    """Would `request` fit on `node` with the named pods' compute lowered to the given milli per GPU? Asked
    of a snapshot: the ledger is never changed for the question."""
    regrants: dict[str, Allocation] = {}
    for uid, milli in squeezes.items():
        held = snapshot.holds(uid)
        if held is not None:
            regrants[uid] = squeezed_allocation(held, milli)
    return snapshot.fits(request, node, regrants=regrants)


def _with_allocation(pod: Obj, text: str, squeezed: str | None) -> Obj:
    out = copy.deepcopy(pod)
    annotations = out.setdefault("metadata", {}).setdefault("annotations", {})
    annotations[ANN_ALLOCATION] = text
    if squeezed is None:
        annotations.pop(ANN_SQUEEZED, None)
    else:
        annotations[ANN_SQUEEZED] = squeezed
    return out


async def squeeze_pod(cluster: ClusterPort, ledger: Ledger, pod: Obj, milli: int, now: float,
                      tries: int = 2) -> Obj | None:
    """Lower the pod's compute to `milli` per GPU; returns the patched pod, or None when it could not be
    (no longer squeezable, API error: the next cycle decides again). The watch cache may lag behind the
    pod's last change (e.g. a squeeze a moment ago): on a conflict the pod is read again and, if it is still
    the same pod and squeezable, patched once more."""
    meta = pod.get("metadata") or {}
    doc = squeezable_doc(pod)
    if doc is None:
        return None
    text = with_cores(doc, {g.uuid: min(g.cores, milli / 10) for g in doc.gpus})
    since = str((meta.get("annotations") or {}).get(ANN_SQUEEZED) or format_time(now))
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    try:
        patched = await cluster.patch_pod_annotations(namespace, name, {ANN_ALLOCATION: text, ANN_SQUEEZED: since},
                                                      resource_version=meta.get("resourceVersion"))
    except Conflict:
        if tries <= 1:
            return None
        try:
            fresh = await cluster.get_pod(namespace, name)
        except ApiError:
            return None
        if (fresh.get("metadata") or {}).get("uid") != meta.get("uid"):
            return None
        return await squeeze_pod(cluster, ledger, fresh, milli, now, tries - 1)
    except ApiError as e:
        log.info("squeezing %s/%s: %s", shown(namespace, 64), shown(name, 253), e)
        return None
    ledger.apply_pod("MODIFIED", patched)
    return patched


def _since(pod: Obj) -> float:
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_SQUEEZED)
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0  # unreadable: as if squeezed long ago


def may_lift(cache: QueueCache, entry: Entry, pending: Mapping[str, Any]) -> bool:
    """Conditions (b) and (c) of the module doc, on the ledger as it stands."""
    queue = cache.queue_of(namespace_of(entry.key))
    full = full_allocation(entry)
    decision = admit(cache.queues.tree, cache.usage(without=entry.uid), queue,
                     charge_of_allocation(full, cache.gpu_memory()))
    if not isinstance(decision, Admitted):
        return False
    if decision.borrowing and any(cache.queue_of(namespace_of(k)) != queue for k in pending):
        return False  # it would borrow again while another queue's pod waits: the squeeze stays
    return Snapshot(cache.ledger).takes(entry.uid, full)


async def lift_squeezes(cluster: ClusterPort, cache: QueueCache, pending: Mapping[str, Any], now: float,
                        hold_s: float = DEFAULT_HOLD_S) -> list[str]:
    """Lift every squeeze whose conditions hold; returns the keys of the pods given their compute back."""
    lifted: list[str] = []
    for uid, entry in list(cache.ledger.confirmed().items()):
        if not is_squeezed_entry(entry) or not may_lift(cache, entry, pending):
            continue
        namespace, name = entry.key.split("/", 1)
        try:
            pod = await cluster.get_pod(namespace, name)
        except ApiError:
            continue
        if str((pod.get("metadata") or {}).get("uid")) != uid or now - _since(pod) < hold_s:
            continue
        current = cache.ledger.entries.get(uid)
        if current is None or not is_squeezed_entry(current) or not may_lift(cache, current, pending):
            continue  # the awaits above let other decisions run: ask again on the ledger as it is now
        text = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_ALLOCATION)
        try:
            doc = decode_allocation(str(text))
        except AllocationError:
            continue
        milli = min(current.request.gpu.milli, MILLI_PER_GPU)
        restored = _with_allocation(pod, with_cores(doc, {g.uuid: milli / 10 for g in doc.gpus}), None)
        cache.ledger.apply_pod("MODIFIED", restored)  # the capacity is taken now, before any await
        try:
            patched = await cluster.patch_pod_annotations(
                namespace, name, {ANN_ALLOCATION: restored["metadata"]["annotations"][ANN_ALLOCATION],
                                  ANN_SQUEEZED: None},
                resource_version=(pod.get("metadata") or {}).get("resourceVersion"))
        except ApiError as e:
            log.info("lifting the squeeze of %s: %s", shown(entry.key, 300), e)
            cache.ledger.apply_pod("MODIFIED", pod)  # back to the squeezed grant (smaller: it fits)
            continue
        cache.ledger.apply_pod("MODIFIED", patched)
        lifted.append(entry.key)
        log.info("%s: compute squeeze lifted", shown(entry.key, 300))
    return lifted
