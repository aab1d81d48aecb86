"""Permit / Unreserve `node_lock`: the node's bind lock names the pod being bound, so that the node agent's
device-plugin Allocate (which does not say which pod it is for) knows whom it serves. Format and rules:
gpupool.api.lock; the agent's side: docs/scheduler.md "The node bind lock".

Permit takes the lock with a write carrying the node's resourceVersion (a 409 means read again and decide
again). The first look uses the watch's copy of the node (usually current, since binds avoid busy nodes);
"we hold it already" is believed only from a fresh read. A lock held by another pod is taken over when it
is older than `lock_timeout_s`, or its holder was seen served (by this process, or the pod watch shows it
Running/finished or being deleted: no API read), or a read shows it gone, re-created, being deleted or
Running/finished; otherwise Permit answers WAIT (woken by the node watch), for at most `lock_wait_s`.
Unreserve (any failure after the lock was taken) lets go of it: the one place a lock is released.
"""

from __future__ import annotations

import logging
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from gpupool.api.lock import ANN_BIND_LOCK, BindLock, LockError, decode_lock, encode_lock
from gpupool.cluster.port import Conflict, NotFound, Obj
from gpupool.scheduler.busy import SERVED_PHASES
from gpupool.scheduler.framework.cycle import CycleState
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import SUCCESS, Status, wait

log = logging.getLogger(__name__)


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    lock_timeout_s: float = Field(default=300.0, gt=0)
    lock_wait_s: float = Field(default=5.0, ge=0)


class NodeLock:
    name: ClassVar[str] = "node_lock"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle
        self.args = args
        self.max_wait_s = args.lock_wait_s

    async def permit(self, cycle: CycleState, node: str) -> Status:
        h = self.handle
        mine = cycle.data.setdefault(self.name, {"attempt": 0, "delay": 0.05, "taken": False})
        mine["attempt"] += 1
        cached: Obj | None = dict(h.ledger.node_objs[node]) if mine["attempt"] == 1 and node in h.ledger.node_objs \
            else None
        obj = cached or await h.cluster.get_node(node)
        text = (obj["metadata"].get("annotations") or {}).get(ANN_BIND_LOCK)
        if text:
            try:
                held: BindLock | None = decode_lock(text)
            except LockError as e:
                log.warning("node %s: replacing unreadable bind lock: %s", node, e)
                held = None
            if held is not None and held.pod_uid == cycle.uid:
                if cached is None:
                    mine["taken"] = True
                    return SUCCESS
                return wait("our own lock on a cached copy: read the node again")  # at once
            if held is not None and not await self._may_take_over(held):
                delay = mine["delay"]
                mine["delay"] = min(delay * 2, 0.2)
                return wait(f"node {node} is locked by pod {held.namespace}/{held.name} since {held.time} "
                            "(waiting for its device allocation); retry later", h.waiter(node), delay)
        namespace, name = cycle.key.split("/", 1)
        lock = encode_lock(cycle.uid, namespace, name, h.clock())
        try:
            await h.cluster.patch_node_annotations(
                node, {ANN_BIND_LOCK: lock}, resource_version=obj["metadata"]["resourceVersion"])
        except Conflict:
            h.metrics.conflicts.labels("node").inc()
            return wait("the node changed meanwhile: read it again")  # at once
        mine["taken"] = True
        return SUCCESS

    async def unreserve(self, cycle: CycleState, node: str) -> None:
        mine = cycle.data.get(self.name)
        if mine and mine["taken"]:
            await release_lock(self.handle, node, cycle.uid)

    async def _may_take_over(self, held: BindLock) -> bool:
        h = self.handle
        now = h.clock()
        if now - held.taken_at() > self.args.lock_timeout_s or h.busy.was_served(held.pod_uid, now):
            return True
        # The pod watch's copy (by UID) showing the holder served is enough: a pod never goes back from
        # Running or finished, nor un-deletes. Anything else is asked of the API server (the cache may lag).
        seen = h.pods.get(held.pod_uid)
        if seen is not None and _served(seen):
            return True
        try:
            holder = await h.cluster.get_pod(held.namespace, held.name)
        except NotFound:
            return True
        return holder["metadata"].get("uid") != held.pod_uid or _served(holder)


def _served(pod: Obj) -> bool:
    """The lock's holder no longer needs it: being deleted, or Running / finished."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp")) or \
        (pod.get("status") or {}).get("phase") in SERVED_PHASES


async def release_lock(handle: Handle, node_name: str, uid: str) -> None:
    """Remove the node's bind lock if it still names `uid` (best effort: a lock left behind is taken over
    once its holder runs or after lock_timeout_s)."""
    for _ in range(5):
        try:
            node = await handle.cluster.get_node(node_name)
        except Exception:
            return
        text = (node["metadata"].get("annotations") or {}).get(ANN_BIND_LOCK)
        try:
            if not text or decode_lock(text).pod_uid != uid:
                return
        except LockError:
            return
        try:
            await handle.cluster.patch_node_annotations(
                node_name, {ANN_BIND_LOCK: None}, resource_version=node["metadata"]["resourceVersion"])
            return
        except Conflict:
            handle.metrics.conflicts.labels("node").inc()
        except Exception:
            return
