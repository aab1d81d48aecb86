"""Reservations made by /filter are bounded in time (docs/scheduler.md, "Reservations"): pods that are
filtered but never bound cannot starve a real pod. Issue 26's scenario, through the extender's HTTP
interface, on a clock the test moves."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from gpupool.cluster.memory import MemoryCluster
from gpupool.demo.embedded import node_objects
from gpupool.scheduler.app import create_app
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.server import serve_in_background
from gpupool.scheduler.service import ExtenderService
from tests.scheduler.conftest import eventually, gpu_pod, small_scenario

START = 10_000.0


@pytest.fixture
async def clocked() -> AsyncIterator[tuple[ExtenderService, str, list[float], MemoryCluster]]:
    """One 8-GPU node; the extender over real HTTP with a clock the test moves; expiry checked often."""
    cluster = MemoryCluster()
    for obj in node_objects(small_scenario(nodes=1, gpus=8)):
        await cluster.create_node(obj)
    now = [START]
    config = SchedulerConfig(port=0, leader_elect=False, expire_interval_s=0.01)
    svc = ExtenderService(cluster, config, clock=lambda: now[0])
    await svc.start()
    server = await serve_in_background(create_app(svc), "127.0.0.1", 0)
    yield svc, server.url, now, cluster
    await server.stop()
    await svc.stop()


async def expired(svc: ExtenderService, now: float) -> None:
    """Wait until the service's periodic expiry has seen the clock's time (the only synchronisation)."""
    await eventually(lambda: all(e.deadline > now for e in svc.ledger.assumed().values()))


async def test_pods_filtered_but_never_bound_cannot_starve_a_real_pod(clocked, client: httpx.AsyncClient) -> None:
    svc, url, now, cluster = clocked
    node = ["gpu-0000"]
    idle = [await cluster.create_pod(gpu_pod(f"idle-{i}", cores=None)) for i in range(8)]  # a whole GPU each
    real = await cluster.create_pod(gpu_pod("real", cores=None))
    answers: dict[int, bool] = {}
    for second in range(46):
        now[0] = START + second
        await expired(svc, now[0])
        if second % 8 == 0:  # the 8 pods are sent to /filter again and again, and never bound
            for pod in idle:
                await client.post(f"{url}/filter", json={"Pod": pod, "NodeNames": node})
        if second % 2 == 1:  # the real pod, as kube-scheduler retries it
            answer = (await client.post(f"{url}/filter", json={"Pod": real, "NodeNames": node})).json()
            answers[second] = answer["NodeNames"] == node
    # The 8 reservations hold for nomination_budget_s (10 s) from their first filter, re-filtered or
    # not; after that the real pod fits at every try (before: refused at every try, 23 of 23).
    assert answers == {s: s > 10 for s in range(1, 46, 2)}
    # The idle pods get no reservation again until the window (300 s) has passed: the real pod's GPU is not
    # taken from it by their next filter.
    for pod in idle:
        r = (await client.post(f"{url}/filter", json={"Pod": pod, "NodeNames": node})).json()
        assert r["NodeNames"] == node  # they still fit: only the reservation is withheld
    assert svc.ledger.assumed() == {}  # (the real pod's own ended too: it was not bound within 10 s either)


async def test_a_pod_that_binds_is_never_held_back(clocked, client: httpx.AsyncClient) -> None:
    """The rule counts from the first nomination since the pod last bound: a bind ends the count."""
    svc, url, now, cluster = clocked
    node = ["gpu-0000"]
    pod = await cluster.create_pod(gpu_pod("p", cores=30))
    for second in (0, 4, 8):
        now[0] = START + second
        await client.post(f"{url}/filter", json={"Pod": pod, "NodeNames": node})
    assert svc.ledger.assumed()[pod["metadata"]["uid"]].deadline == START + 10  # capped at the first + 10 s
    now[0] = START + 12
    await expired(svc, now[0])
    await client.post(f"{url}/filter", json={"Pod": pod, "NodeNames": node})
    assert pod["metadata"]["uid"] not in svc.ledger.assumed()  # 12 s unbound: no reservation
