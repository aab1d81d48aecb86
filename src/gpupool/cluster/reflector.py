"""One reflector for every service: keeps a local store of one kind in step with the API server.

The loop client-go's reflector runs, over the cluster port: list (the store is replaced by the answer and
the differences become events) → watch from the list's resourceVersion → on `Gone` (410: that version is
no longer in the server's history) list again at once → on any other error wait (exponential backoff,
capped) and watch again from the last version seen → when the watch ends (server timeout) watch again.

The store is keyed by (namespace, name) — "" for cluster-scoped kinds — and indexed by UID: an object
deleted and re-created under the same name while the watch was down comes back from the next list with a
new UID and is reported as a DELETED of the old object and an ADDED of the new one, never as a MODIFIED.

Objects in the store and in events are shared with the port and with other handlers: read-only. Handlers
(`on_event(type, obj, old)`, plain or async) run in order, one at a time; one that raises is logged and
the reflector goes on (a handler's bug must not stop the cache).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gpupool.cluster.port import ClusterPort, Gone, Kind, Obj, Selector, WatchEvent

log = logging.getLogger("gpupool.cluster.reflector")

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
Key = tuple[str, str]
# (event type, the object as it is now — its last state for DELETED —, the previous state or None)
Handler = Callable[[str, Obj, Obj | None], Awaitable[None] | None]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Wait before retrying after the n-th error in a row: initial * factor**(n-1), at most `max_s`."""

    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0

    def delay(self, failures: int) -> float:
        return min(self.max_s, self.initial_s * self.factor ** max(failures - 1, 0))


def key_of(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name", ""))


def _uid(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


def _rv(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


class Reflector:
    def __init__(
        self,
        port: ClusterPort,
        kind: Kind,
        *,
        namespace: str | None = None,
        labels: Selector | None = None,
        fields: Selector | None = None,
        on_event: Handler | None = None,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.port = port
        self.kind = kind
        self.namespace = namespace
        self.labels = dict(labels or {})
        self.fields = dict(fields or {})
        self.handlers: list[Handler] = [on_event] if on_event is not None else []
        self.backoff = backoff or Backoff()
        self._sleep = sleep
        self.store: dict[Key, Obj] = {}
        self._by_uid: dict[str, Key] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()  # set once the first list is in the store
        self.lists = 0  # how many times it listed (1 + relists after Gone or errors)
        self.errors = 0  # errors seen, in total
        self.last_error = ""
        self._task: asyncio.Task[None] | None = None

    # --- reading the store ----------------------------------------------------------------------------

    def get(self, name: str, namespace: str | None = None) -> Obj | None:
        return self.store.get(((namespace or "default") if self.kind.namespaced else "", name))

    def get_by_uid(self, uid: str) -> Obj | None:
        key = self._by_uid.get(uid)
        return None if key is None else self.store.get(key)

    def items(self) -> list[Obj]:
        return list(self.store.values())

    def add_handler(self, handler: Handler) -> None:
        self.handlers.append(handler)

    # --- running ----------------------------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        """Run in a task of the current loop; `stop` ends it."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name=f"reflector-{self.kind}")
        return self._task

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def run(self) -> None:
        """List and watch until cancelled."""
        must_list = True
        failures = 0  # errors in a row; an event received resets it
        gones = 0  # 410s with no event in between
        while True:
            try:
                if must_list:
                    items, version = await self.port.list_objects(
                        self.kind, namespace=self.namespace, labels=self.labels or None, fields=self.fields or None
                    )
                    self.lists += 1
                    await self._replace(items, version)
                    must_list = False
                    self.synced.set()
                stream = self.port.watch_objects(
                    self.kind, self.resource_version, namespace=self.namespace, labels=self.labels or None,
                    fields=self.fields or None,
                )
                async for event in stream:
                    await self._apply(event)
                    failures = gones = 0
            except Gone as e:
                # The version is no longer in the server's history: only a new list can resync, at once. A
                # second Gone with nothing seen in between is an error like any other, so it cannot spin.
                self._failed(e)
                must_list = True
                gones += 1
                if gones > 1:
                    failures += 1
                    await self._sleep(self.backoff.delay(failures))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # API errors and transport errors alike: back off, then watch (or list) again
                self._failed(e)
                failures += 1
                await self._sleep(self.backoff.delay(failures))

    def _failed(self, e: Exception) -> None:
        self.errors += 1
        self.last_error = f"{type(e).__name__}: {e}"
        log.info("%s reflector: %s", self.kind, self.last_error)

    async def wait_synced(self) -> None:
        await self.synced.wait()

    # --- applying changes -------------------------------------------------------------------------------

    async def _replace(self, items: list[Obj], version: str) -> None:
        """The store becomes `items`; the differences from before are reported as events."""
        fresh = {key_of(o): o for o in items}
        for key, old in list(self.store.items()):
            new = fresh.get(key)
            if new is None or _uid(new) != _uid(old):
                self._drop(key)
                await self._notify(DELETED, old, None)
        for key, obj in fresh.items():
            before = self.store.get(key)
            self._put(key, obj)
            if before is None:
                await self._notify(ADDED, obj, None)
            elif _rv(before) != _rv(obj):
                await self._notify(MODIFIED, obj, before)
        self.resource_version = version

    async def _apply(self, event: WatchEvent) -> None:
        obj = event.object
        key = key_of(obj)
        if event.type in (ADDED, MODIFIED):
            old = self.store.get(key)
            if old is not None and _uid(old) != _uid(obj):  # the DELETED of the old one was not seen
                self._drop(key)
                await self._notify(DELETED, old, None)
                old = None
            self._put(key, obj)
            if old is None or _rv(old) != _rv(obj):  # a server replaying what the store has is no change
                await self._notify(ADDED if old is None else MODIFIED, obj, old)
        elif event.type == DELETED:
            old = self.store.get(key)
            if old is not None:
                self._drop(key)
            await self._notify(DELETED, obj, old)
        # BOOKMARK (and anything newer) carries only a resourceVersion
        if _rv(obj):
            self.resource_version = _rv(obj)

    def _put(self, key: Key, obj: Obj) -> None:
        self.store[key] = obj
        self._by_uid[_uid(obj)] = key

    def _drop(self, key: Key) -> None:
        old = self.store.pop(key, None)
        if old is not None:
            self._by_uid.pop(_uid(old), None)

    async def _notify(self, type_: str, obj: Obj, old: Obj | None) -> None:
        for handler in self.handlers:
            try:
                result = handler(type_, obj, old)
                if inspect.isawaitable(result):
                    await result
            except Exception:  # a handler's bug must not stop the cache
                log.exception("%s reflector: handler %r failed on %s %s", self.kind, handler, type_, key_of(obj))
