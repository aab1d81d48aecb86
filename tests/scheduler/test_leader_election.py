"""Lease-based leader election on the memory cluster with a controlled clock."""

from __future__ import annotations

from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import ApiError
from gpupool.scheduler.leader import LeaderElector


def _pair(cluster, now):
    log: list[str] = []

    def make(identity: str) -> LeaderElector:
        async def started() -> None:
            log.append(f"{identity}+")

        async def stopped() -> None:
            log.append(f"{identity}-")

        return LeaderElector(cluster, "kube-system", "gpupool", identity, lease_duration_s=15, renew_deadline_s=10,
                             clock=lambda: now[0], on_started=started, on_stopped=stopped)

    return make("a"), make("b"), log


async def test_one_leader_at_a_time_and_takeover_after_expiry():
    cluster = MemoryCluster()
    now = [1_000_000.0]
    a, b, log = _pair(cluster, now)
    assert await a.try_acquire_or_renew() is True
    assert await b.try_acquire_or_renew() is False
    now[0] += 10
    assert await a.try_acquire_or_renew() is True  # renewal keeps it
    now[0] += 14
    assert await b.try_acquire_or_renew() is False  # 14 s since the last renewal < 15 s lease
    now[0] += 2
    assert await b.try_acquire_or_renew() is True  # a stopped renewing 16 s ago
    assert await a.try_acquire_or_renew() is False
    assert log == ["a+", "b+", "a-"]
    lease = await cluster.get_lease("kube-system", "gpupool")
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1


async def test_leader_that_cannot_renew_steps_down_after_the_renew_deadline():
    cluster = MemoryCluster()
    now = [1_000_000.0]
    a, _, log = _pair(cluster, now)
    assert await a.try_acquire_or_renew()
    real_get = cluster.get_lease

    async def broken(namespace: str, name: str) -> dict:
        raise ApiError("API server unreachable")

    cluster.get_lease = broken  # type: ignore[method-assign]
    now[0] += 5
    assert await a.try_acquire_or_renew() is True  # within the 10 s renew deadline: still leading
    now[0] += 6
    assert await a.try_acquire_or_renew() is False  # 11 s without renewal: steps down on its own
    assert log == ["a+", "a-"]
    cluster.get_lease = real_get  # type: ignore[method-assign]
    assert await a.try_acquire_or_renew() is True  # its own lease: re-acquired


async def test_failover_between_replicas_serves_only_after_a_fresh_sync():
    import httpx

    from gpupool.demo.embedded import node_objects
    from gpupool.scheduler.config import SchedulerConfig
    from gpupool.scheduler.runner import start_replica
    from tests.scheduler.conftest import gpu_pod, small_scenario

    cluster = MemoryCluster()
    for obj in node_objects(small_scenario()):
        await cluster.create_node(obj)

    def config(identity: str) -> SchedulerConfig:
        return SchedulerConfig(port=0, identity=identity, lease_duration_s=1, renew_deadline_s=0.6,
                               retry_period_s=0.1)

    first = await start_replica(cluster, config("first"))
    await _until(lambda: first.service.ready)
    second = await start_replica(cluster, config("second"))
    async with httpx.AsyncClient(timeout=10) as client:
        assert (await client.get(f"{second.url}/readyz")).status_code == 503  # synced, but not leading
        pod = await cluster.create_pod(gpu_pod("p", cores=50))
        args = {"PodName": "p", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "gpu-0000"}
        assert "not ready" in (await client.post(f"{second.url}/bind", json=args)).json()["Error"]
        # Bound through the leader, then the leader dies without releasing the lease.
        assert (await client.post(f"{first.url}/bind", json=args)).json()["Error"] == ""
        await first.stop()
        await _until(lambda: second.service.ready, timeout=10)
        assert (await client.get(f"{second.url}/readyz")).status_code == 200
        # The new leader's ledger came from a fresh list: it holds the pod bound by the old leader.
        assert [e.key for e in second.service.ledger.confirmed().values()] == ["default/p"]
    await second.stop()
    await cluster.close()


async def _until(predicate, timeout: float = 5.0) -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)
