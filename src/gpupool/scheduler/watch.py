"""The scheduler's watch loops: list nodes and pods, then follow their watch streams into the ledger (the
framework's cache), the pod cache, busy nodes, pending pods and the observed workload. A 410 lists again;
any other failure retries with back-off, so a broken stream never stops the service.

DRA ResourceClaims are followed into the ledger too (claims of gpupool's driver hold GPU shares like pods);
where the API server has no resource.k8s.io/v1 or the scheduler may not list claims, that is logged once
and the scheduler goes on without them. So are the remote shares' moves (gpupool.api.moves: the one ConfigMap
MOVES_CONFIGMAP in gpupool's namespace, the scheduler's `gpupool_namespace`): the ledger counts a moving share
where it is held.

The learned workload (gpupool.scheduler.workload) learns here, from pods the API shows bound with an
allocation, and nowhere else: a request body teaches it nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from gpupool.api.moves import MOVES_CONFIGMAP, read_moves
from gpupool.api.pod import pod_key
from gpupool.cluster.port import CONFIGMAPS, RESOURCE_CLAIMS, ApiError, Gone, Obj, WatchEvent
from gpupool.scheduler.claims import ClaimAllocator
from gpupool.scheduler.framework.interface import Handle

log = logging.getLogger(__name__)


class Watcher:
    def __init__(self, handle: Handle, claims: ClaimAllocator | None = None) -> None:
        self.h = handle
        self.claims = claims  # gpupool's allocator of its DRA claims, fed with pods and claims
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._refresh_due = False

    async def start(self) -> None:
        """List nodes and pods (synchronously into the caches), then follow both streams."""
        h = self.h
        self._stopping = False
        nodes, node_rv = await h.cluster.list_nodes()
        pods, pod_rv = await h.cluster.list_pods()
        self._replace_nodes(nodes)
        self._replace_pods(pods)
        moves_rv = await self._list_moves()  # before the claims: each is counted where it is held at once
        claim_rv = await self._list_claims()
        h.workload.seed(e.request for e in h.ledger.entries.values() if not e.claim)
        log.info("ledger synced: %d gpupool nodes, %d GPUs, %d allocations, %d pods",
                 len(h.ledger.state), h.ledger.state.total_gpus, len(h.ledger.entries), len(h.pods))
        self._tasks = [
            asyncio.create_task(self._follow("node", node_rv)),
            asyncio.create_task(self._follow("pod", pod_rv)),
            asyncio.create_task(self._expire_loop()),
        ]
        if claim_rv is not None:
            self._tasks.append(asyncio.create_task(self._follow("claim", claim_rv)))
        if moves_rv is not None:
            self._tasks.append(asyncio.create_task(self._follow("moves", moves_rv)))

    async def stop(self) -> None:
        self._stopping = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []

    async def _list_claims(self) -> str | None:
        """List the ResourceClaims into the ledger; None when they cannot be listed (no DRA here)."""
        try:
            claims, rv = await self.h.cluster.list_objects(RESOURCE_CLAIMS)
        except ApiError as e:
            log.warning("DRA ResourceClaims not followed (%s): claims of gpupool's driver will not count", e)
            return None
        self._replace_claims(claims)
        return rv

    # --- the remote shares' moves: one ConfigMap, listed and watched by name ---------------------------

    async def _list_moves(self) -> str | None:
        """Read the moves into the ledger; None when they cannot be read (logged: moved shares then count
        where their claims were allocated)."""
        try:
            objs, rv = await self._list_moves_again()
        except ApiError as e:
            log.warning("remote share moves not followed (%s): a moved share counts on the GPU it was allocated", e)
            return None
        self._replace_moves(objs)
        return rv

    async def _list_moves_again(self) -> tuple[list[Obj], str]:
        return await self.h.cluster.list_objects(CONFIGMAPS, namespace=self.h.config.own_namespace(),
                                                 fields={"metadata.name": MOVES_CONFIGMAP})

    def _watch_moves(self, rv: str) -> AsyncIterator[WatchEvent]:
        return self.h.cluster.watch_objects(CONFIGMAPS, rv, namespace=self.h.config.own_namespace(),
                                            fields={"metadata.name": MOVES_CONFIGMAP})

    def _replace_moves(self, objs: list[Obj]) -> None:
        self.h.ledger.replace_moves(read_moves(objs[0] if objs else None))

    def _moves_event(self, event: WatchEvent) -> None:
        self.h.ledger.replace_moves(read_moves(None if event.type == "DELETED" else event.object))

    async def _list_claims_again(self) -> tuple[list[Obj], str]:
        return await self.h.cluster.list_objects(RESOURCE_CLAIMS)

    def _watch_claims(self, rv: str) -> AsyncIterator[WatchEvent]:
        return self.h.cluster.watch_objects(RESOURCE_CLAIMS, rv)

    def _replace_claims(self, objs: list[Obj]) -> None:
        self.h.ledger.replace_claims(objs)
        if self.claims is not None:
            self.claims.replace_claims(objs)

    def _claim_event(self, event: WatchEvent) -> None:
        self.h.ledger.apply_claim(event.type, event.object)
        if self.claims is not None:
            self.claims.claim_event(event)

    # --- applying events ------------------------------------------------------------------------------

    def _replace_nodes(self, objs: list[Obj]) -> None:
        self.h.ledger.replace_nodes(objs)

    def _replace_pods(self, objs: list[Obj]) -> None:
        self.h.ledger.replace_pods(objs)
        self.h.pods.replace(objs)
        self.h.busy.replace(objs)
        if self.claims is not None:
            self.claims.gated.clear()
            for pod in objs:
                self.claims.pod_event("ADDED", pod)

    def _node_event(self, event: WatchEvent) -> None:
        h = self.h
        if h.ledger.apply_node(event.type, event.object, rebuild=False) and not self._refresh_due:
            # One rebuild for the events the stream delivers together: the callback runs once the watch
            # waits for more (a watch yields buffered events without returning to the loop).
            self._refresh_due = True
            asyncio.get_running_loop().call_soon(self._refresh)

    def _refresh(self) -> None:
        self._refresh_due = False
        self.h.ledger.refresh()

    def _pod_event(self, event: WatchEvent) -> None:
        h, pod = self.h, event.object
        confirmed = h.ledger.apply_pod(event.type, pod)
        h.pods.apply(event.type, pod)
        if confirmed is not None and confirmed.request.gpu.count:
            h.workload.observe(confirmed.uid, confirmed.request)
        node = (pod.get("spec") or {}).get("nodeName")
        if event.type == "DELETED" or node:
            h.pending.discard(pod_key(pod))
        h.busy.on_pod(event.type, pod)
        if self.claims is not None:
            self.claims.pod_event(event.type, pod)
        if node:
            # A pod on this node changed: if it waited for its Allocate and now runs, a waiting bind may go.
            h.wake(str(node))

    async def _follow(self, kind: str, resource_version: str) -> None:
        h = self.h
        watch: Callable[[str], AsyncIterator[WatchEvent]]
        lister: Callable[[], Awaitable[tuple[list[Obj], str]]]
        if kind == "node":
            watch, lister, apply, replace = h.cluster.watch_nodes, h.cluster.list_nodes, self._node_event, \
                self._replace_nodes
        elif kind == "moves":
            watch, lister, apply, replace = self._watch_moves, self._list_moves_again, self._moves_event, \
                self._replace_moves
        elif kind == "claim":
            watch, lister, apply, replace = self._watch_claims, self._list_claims_again, self._claim_event, \
                self._replace_claims
        else:
            watch, lister, apply, replace = h.cluster.watch_pods, h.cluster.list_pods, self._pod_event, \
                self._replace_pods
        rv = resource_version
        backoff = 0.1
        while not self._stopping:
            try:
                async for event in watch(rv):
                    apply(event)
                    rv = str(event.object["metadata"]["resourceVersion"])
                    backoff = 0.1
            except asyncio.CancelledError:
                raise
            except Gone:
                log.info("%s watch expired; listing again", kind)
                objs, rv = await lister()
                replace(objs)
            except Exception as e:  # keep following: a broken watch must not stop the service
                log.warning("%s watch failed (%s); retrying in %.1fs", kind, e, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _expire_loop(self) -> None:
        h = self.h
        while True:
            await asyncio.sleep(h.config.expire_interval_s)
            forgotten = h.ledger.expire(h.clock())
            if forgotten:
                h.metrics.forgotten.inc(len(forgotten))
            h.pending.expire()
