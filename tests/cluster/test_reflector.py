"""The shared reflector on the embedded cluster: list then watch, relist on 410 with the differences as
events, backoff on errors (an injected sleep records the delays: no wall clock), selectors, custom kinds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import CRDS, PODS, ApiError, Gone, Kind, Obj, Selector, WatchEvent
from gpupool.cluster.reflector import Backoff, Reflector

QUEUES = Kind("gpupool.io", "v1alpha1", "GPUQueue", "gpuqueues", namespaced=False)


def pod(name: str, labels: dict[str, str] | None = None, node: str | None = None) -> Obj:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "i"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "default", "labels": labels or {}}, "spec": spec}


class Seen:
    """A handler that records (type, name) and lets a test wait for a condition on the records."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.olds: list[Obj | None] = []
        self._changed = asyncio.Condition()

    async def __call__(self, type_: str, obj: Obj, old: Obj | None) -> None:
        self.events.append((type_, obj["metadata"]["name"]))
        self.olds.append(old)
        async with self._changed:
            self._changed.notify_all()

    async def until(self, predicate: Callable[[list[tuple[str, str]]], bool]) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: predicate(self.events)), 10)


async def test_list_then_watch_keeps_the_store_and_reports_every_change() -> None:
    c = MemoryCluster()
    await c.create_pod(pod("a"))
    seen = Seen()
    r = Reflector(c, PODS, on_event=seen)
    r.start()
    try:
        await r.wait_synced()
        assert seen.events == [("ADDED", "a")] and r.lists == 1
        created = await c.create_pod(pod("b"))
        await c.patch_pod_annotations("default", "a", {"k": "v"})
        await c.delete_pod("default", "b")
        await seen.until(lambda e: len(e) == 4)
        assert seen.events[1:] == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
        assert seen.olds[2] is not None and "annotations" not in seen.olds[2]["metadata"]  # the state before
        assert r.get("a") is not None and r.get("a")["metadata"]["annotations"] == {"k": "v"}  # type: ignore[index]
        assert r.get("b") is None and r.get_by_uid(created["metadata"]["uid"]) is None
        _, now = await c.list_pods()
        assert r.resource_version == now
    finally:
        await r.stop()


class GoneOnce(MemoryCluster):
    """The first watch fails with 410 after `meanwhile` changed the cluster (changes the watch missed)."""

    def __init__(self) -> None:
        super().__init__()
        self.meanwhile: Callable[[], Any] | None = None
        self.watches = 0

    def watch_objects(self, kind: Kind, resource_version: str, **selectors: Any) -> AsyncIterator[WatchEvent]:
        self.watches += 1
        if self.watches == 1:
            return self._gone()
        return super().watch_objects(kind, resource_version, **selectors)

    async def _gone(self) -> AsyncIterator[WatchEvent]:
        if self.meanwhile is not None:
            await self.meanwhile()
        raise Gone("too old resource version")
        yield  # an async generator


async def test_gone_relists_at_once_and_reports_what_the_watch_missed() -> None:
    c = GoneOnce()
    keep = await c.create_pod(pod("keep"))
    twin = await c.create_pod(pod("twin"))
    await c.create_pod(pod("gone"))

    async def meanwhile() -> None:
        await c.delete_pod("default", "gone")
        await c.delete_pod("default", "twin")
        await c.create_pod(pod("twin"))  # same name, new UID
        await c.create_pod(pod("new"))
        await c.patch_pod_annotations("default", "keep", {"k": "v"})

    c.meanwhile = meanwhile
    seen = Seen()
    delays: list[float] = []

    async def sleep(s: float) -> None:
        delays.append(s)

    r = Reflector(c, PODS, on_event=seen, sleep=sleep)
    r.start()
    try:
        await seen.until(lambda e: len(e) >= 3 + 5)
        first, after = seen.events[:3], seen.events[3:]
        assert sorted(first) == [("ADDED", "gone"), ("ADDED", "keep"), ("ADDED", "twin")]
        # the re-created twin is a DELETED of the old object and an ADDED of the new one, never a MODIFIED
        assert sorted(after) == sorted([("DELETED", "gone"), ("DELETED", "twin"), ("ADDED", "twin"),
                                        ("ADDED", "new"), ("MODIFIED", "keep")])
        assert r.lists == 2 and delays == []  # relisted at once, no backoff
        assert r.get("twin")["metadata"]["uid"] != twin["metadata"]["uid"]  # type: ignore[index]
        assert r.get_by_uid(twin["metadata"]["uid"]) is None
        assert r.get_by_uid(keep["metadata"]["uid"]) is not None
        assert {k[1] for k in r.store} == {"keep", "twin", "new"}
    finally:
        await r.stop()


class Failing(MemoryCluster):
    """`list_objects` fails `fail` times (an API outage), then works."""

    def __init__(self, fail: int) -> None:
        super().__init__()
        self.fail = fail

    async def list_objects(
        self, kind: Kind, *, namespace: str | None = None, labels: Selector | None = None,
        fields: Selector | None = None,
    ) -> tuple[list[Obj], str]:
        if self.fail:
            self.fail -= 1
            raise ApiError("etcdserver: request timed out")
        return await super().list_objects(kind, namespace=namespace, labels=labels, fields=fields)


async def test_errors_back_off_exponentially_up_to_the_cap() -> None:
    c = Failing(fail=5)
    await c.create_pod(pod("a"))
    delays: list[float] = []

    async def sleep(s: float) -> None:
        delays.append(s)

    r = Reflector(c, PODS, backoff=Backoff(initial_s=0.5, factor=2.0, max_s=4.0), sleep=sleep)
    r.start()
    try:
        await asyncio.wait_for(r.wait_synced(), 10)
        assert delays == [0.5, 1.0, 2.0, 4.0, 4.0]  # 0.5 * 2**(n-1), capped at 4
        assert r.errors == 5 and "request timed out" in r.last_error
        assert [k[1] for k in r.store] == ["a"]
    finally:
        await r.stop()


async def test_selectors_keep_only_matching_objects_and_report_leaving_as_deleted() -> None:
    c = MemoryCluster()
    await c.create_pod(pod("in", {"team": "a"}, node="n1"))
    await c.create_pod(pod("other-node", {"team": "a"}, node="n2"))
    await c.create_pod(pod("other-team", {"team": "b"}, node="n1"))
    seen = Seen()
    r = Reflector(c, PODS, labels={"team": "a"}, fields={"spec.nodeName": "n1"}, on_event=seen)
    r.start()
    try:
        await r.wait_synced()
        assert seen.events == [("ADDED", "in")]
        await c.patch_object(PODS, "other-team", {"metadata": {"labels": {"team": "a"}}}, namespace="default")
        await c.patch_object(PODS, "in", {"metadata": {"labels": {"team": "b"}}}, namespace="default")
        await seen.until(lambda e: len(e) == 3)
        assert seen.events[1:] == [("ADDED", "other-team"), ("DELETED", "in")]
        assert [k[1] for k in r.store] == ["other-team"]
    finally:
        await r.stop()


async def test_a_custom_resource_and_a_failing_handler() -> None:
    c = MemoryCluster()
    await c.create_object(CRDS, {
        "metadata": {"name": "gpuqueues.gpupool.io"},
        "spec": {"group": "gpupool.io", "scope": "Cluster", "names": {"plural": "gpuqueues", "kind": "GPUQueue"},
                 "versions": [{"name": "v1alpha1", "served": True, "storage": True}]},
    })
    seen = Seen()

    def broken(type_: str, obj: Obj, old: Obj | None) -> None:
        raise RuntimeError("a handler bug")

    r = Reflector(c, QUEUES, on_event=broken)
    r.add_handler(seen)
    r.start()
    try:
        await r.wait_synced()
        await c.create_object(QUEUES, {"metadata": {"name": "research"}, "spec": {"weight": 2}})
        await seen.until(lambda e: e == [("ADDED", "research")])  # the broken handler did not stop it
        assert r.get("research")["spec"] == {"weight": 2}  # type: ignore[index]
    finally:
        await r.stop()


@given(st.lists(st.tuples(st.sampled_from(["create", "patch", "delete"]), st.sampled_from("abc")), max_size=12),
       st.integers(0, 12))
def test_the_store_equals_a_fresh_list_after_any_changes_and_a_410(ops: list[tuple[str, str]], cut: int) -> None:
    """Invariant: whatever happened before and during a watch outage, after the relist the store holds
    exactly what a list returns now (same names, same UIDs, same versions)."""

    async def scenario() -> None:
        c = GoneOnce()

        async def apply(batch: list[tuple[str, str]]) -> None:
            for op, name in batch:
                exists = any(p["metadata"]["name"] == name for p in (await c.list_pods())[0])
                if op == "create" and not exists:
                    await c.create_pod(pod(name))
                elif op == "patch" and exists:
                    await c.patch_pod_annotations("default", name, {"n": str(len(batch))})
                elif op == "delete" and exists:
                    await c.delete_pod("default", name)

        await apply(ops[:cut])

        async def meanwhile() -> None:
            await apply(ops[cut:])

        c.meanwhile = meanwhile
        r = Reflector(c, PODS)
        r.start()
        try:
            while c.watches < 2:  # the 410, then the relist and a new watch
                await asyncio.sleep(0)
            pods, version = await c.list_pods()
            want = {(p["metadata"]["name"], p["metadata"]["uid"], p["metadata"]["resourceVersion"]) for p in pods}
            got = {(o["metadata"]["name"], o["metadata"]["uid"], o["metadata"]["resourceVersion"]) for o in r.items()}
            assert got == want and r.resource_version == version
        finally:
            await r.stop()

    asyncio.run(scenario())


def test_backoff_delays() -> None:
    b = Backoff(initial_s=1.0, factor=3.0, max_s=10.0)
    assert [b.delay(n) for n in (1, 2, 3, 4)] == [1.0, 3.0, 9.0, 10.0]


@pytest.mark.parametrize("namespace", [None, "default"])
async def test_get_uses_the_default_namespace_for_namespaced_kinds(namespace: str | None) -> None:
    c = MemoryCluster()
    await c.create_pod(pod("a"))
    r = Reflector(c, PODS, namespace=namespace)
    r.start()
    try:
        await r.wait_synced()
        assert r.get("a") is r.get("a", "default") is not None
    finally:
        await r.stop()
