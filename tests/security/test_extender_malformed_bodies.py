"""Property: every body /filter, /prioritize and /preempt receive is answered 200 or 400, never 500 (issue
26: `Nodes.items[].metadata` not an object gave 500). The bodies are valid requests for a real pod with
one value somewhere replaced by arbitrary JSON, and arbitrary JSON documents; they go over HTTP to the
real extender on the embedded cluster, which runs in a thread of its own so that hypothesis drives it
synchronously."""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpupool.demo.embedded import Embedded, start_embedded
from gpupool.scheduler.config import SchedulerConfig
from tests.scheduler.conftest import gpu_pod, small_scenario

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


class Running:
    """The embedded extender on an event loop in a background thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        config = SchedulerConfig(port=0, leader_elect=False, lock_wait_s=0.05)
        self.emb: Embedded = self.call(start_embedded(small_scenario(), config))
        self.pod: dict[str, Any] = self.call(self.emb.cluster.create_pod(gpu_pod("real", cores=30)))

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def close(self) -> None:
        self.call(self.emb.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture(scope="module")
def running() -> Iterator[Running]:
    r = Running()
    yield r
    r.close()


@pytest.fixture(scope="module")
def http(running: Running) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=running.emb.url, timeout=30) as c:
        yield c


def valid_bodies(running: Running) -> list[dict[str, Any]]:
    pod, names = running.pod, running.emb.node_names
    nodes = {"items": [{"metadata": {"name": n}} for n in names]}
    victims = {"Pods": [{"metadata": {"uid": "u1", "name": "v", "namespace": "default"}}], "NumPDBViolations": 0}
    return [
        {"Pod": pod, "NodeNames": names},
        {"Pod": pod, "Nodes": nodes},
        {"Pod": pod, "NodeNameToVictims": {names[0]: victims}},
        {"Pod": pod, "NodeNameToMetaVictims": {names[0]: {"Pods": [{"UID": "u1"}]}}},
    ]


@st.composite
def mutated(draw: st.DrawFn, base: list[dict[str, Any]]) -> Any:
    """One of the valid bodies with the value at a random path (walked down from the top) replaced."""
    body = copy.deepcopy(draw(st.sampled_from(base)))
    holder: Any = None
    key: Any = None
    node: Any = body
    while isinstance(node, (dict, list)) and node and (holder is None or draw(st.booleans())):
        key = draw(st.sampled_from(sorted(node))) if isinstance(node, dict) else draw(
            st.integers(0, len(node) - 1))
        holder, node = node, node[key]
    if holder is None:
        return draw(JSON)
    holder[key] = draw(JSON)
    return body


def bodies(running: Running) -> st.SearchStrategy[Any]:
    return mutated(valid_bodies(running)) | JSON


PATHS = ("/filter", "/prioritize", "/preempt")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), path=st.sampled_from(PATHS))
@example(data=None, path="/filter")  # the issue's body, always tried
def test_malformed_extender_bodies_get_400_never_500(running: Running, http: httpx.Client,
                                                   data: st.DataObject | None, path: str) -> None:
    if data is None:
        body: Any = {"Pod": running.pod, "Nodes": {"items": [{"metadata": ["gpu-0000"]}]}}
    else:
        body = data.draw(bodies(running))
    r = http.post(path, json=body)
    assert r.status_code in (200, 400), (r.status_code, r.text[:300], body)
    if r.status_code == 400:
        assert r.json()["Error"]


def test_the_issues_bodies_are_refused_with_the_place_named(running: Running, http: httpx.Client) -> None:
    pod = running.pod
    for body, where in [
        ({"Pod": pod, "Nodes": {"items": [{"metadata": "gpu-0000"}]}}, "Nodes.items.0"),
        ({"Pod": pod, "Nodes": {"items": [{"metadata": {"name": ["gpu-0000"]}}]}}, "Nodes.items.0"),
        ({"Pod": {"metadata": 7}, "NodeNames": ["gpu-0000"]}, "Pod"),
    ]:
        for path in ("/filter", "/prioritize"):
            r = http.post(path, json=body)
            assert r.status_code == 400 and where in r.json()["Error"], r.text
    # and the extender still answers a good request
    r = http.post("/filter", json={"Pod": pod, "NodeNames": running.emb.node_names})
    assert r.status_code == 200 and not r.json()["Error"]
