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
