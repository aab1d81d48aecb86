"""The pod a decision reads: the watch cache by UID, one bounded API read when the cache lags, and the
bounds on nominations."""

from __future__ import annotations

import asyncio

from gpupool.api.extender import ExtenderArgs
from gpupool.scheduler.config import SchedulerConfig
from tests.scheduler.conftest import gpu_pod, started_service

NAMES = ["gpu-0000", "gpu-0001"]


async def test_a_pod_the_watch_has_not_delivered_yet_is_read_once_from_the_api():
    svc = await started_service(nodes=2)
    fetches = svc.pods.fetches
    pod = await svc.cluster.create_pod(gpu_pod("fresh", cores=20))
    assert svc.pods.get(pod["metadata"]["uid"]) is None  # no loop turn yet: the watch lags
    answer = await svc.filter(ExtenderArgs(Pod=pod, NodeNames=NAMES))
    assert answer.NodeNames is not None and len(answer.NodeNames) == 1 and answer.NodeNames[0] in NAMES
    assert answer.Error == ""
    assert svc.pods.fetches == fetches + 1
    for _ in range(100):
        if svc.pods.get(pod["metadata"]["uid"]) is not None:
            break
        await asyncio.sleep(0.01)
    await svc.filter(ExtenderArgs(Pod=pod, NodeNames=NAMES))
    assert svc.pods.fetches == fetches + 1  # from the cache now
    await svc.stop()


async def test_an_api_read_that_does_not_answer_in_time_is_a_retryable_error():
    svc = await started_service(nodes=2, config=SchedulerConfig(leader_elect=False, pod_lookup_timeout_s=0.05))

    async def slow_get_pod(namespace: str, name: str) -> dict:
        await asyncio.sleep(5)
        raise AssertionError("not reached")

    svc.cluster.get_pod = slow_get_pod  # type: ignore[method-assign]
    pod = await svc.cluster.create_pod(gpu_pod("slow", cores=20))
    answer = await svc.filter(ExtenderArgs(Pod=pod, NodeNames=NAMES))
    assert answer.NodeNames == [] and "did not answer in time; retry" in answer.Error
    await svc.stop()


async def test_a_uid_the_api_does_not_know_is_read_only_once():
    svc = await started_service(nodes=2)
    ghost = gpu_pod("ghost", cores=20)
    ghost["metadata"]["uid"] = "11111111-2222-3333-4444-555555555555"
    for _ in range(5):
        answer = await svc.filter(ExtenderArgs(Pod=ghost, NodeNames=NAMES))
        assert set(answer.FailedAndUnresolvableNodes.values()) == {"pod default/ghost does not exist"}
    assert svc.pods.fetches == 1
    await svc.stop()


async def test_nominations_are_bounded_in_total_and_per_pod():
    # (The time a pod that does not bind may hold nominations, test_reservation_bounds, is set long enough
    # here not to end them first.)
    config = SchedulerConfig(leader_elect=False, max_nominations=3, nomination_budget_s=120)
    svc = await started_service(nodes=2, config=config)
    pods = [await svc.cluster.create_pod(gpu_pod(f"p{i}", cores=10)) for i in range(5)]
    for pod in pods:
        assert await svc.prioritize(ExtenderArgs(Pod=pod, NodeNames=NAMES))
    assert len(svc.ledger.assumed()) == 3  # the 4th and 5th cycles go on without a reservation
    for pod in pods[:3]:  # their cycles end without a bind
        svc.ledger.forget(pod["metadata"]["uid"])
    # One pod asking again and again: at most 20 nominations a minute (the clock stands still here).
    now = [1000.0]
    svc.handle.clock = lambda: now[0]
    uid = pods[4]["metadata"]["uid"]
    held = []
    for _ in range(25):
        await svc.prioritize(ExtenderArgs(Pod=pods[4], NodeNames=NAMES))
        held.append(uid in svc.ledger.entries)
    assert held == [True] * 20 + [False] * 5
    now[0] += 61  # a new window
    await svc.prioritize(ExtenderArgs(Pod=pods[4], NodeNames=NAMES))
    assert uid in svc.ledger.entries
    await svc.stop()
