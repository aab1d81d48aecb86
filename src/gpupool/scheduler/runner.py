"""One scheduler replica: the extender service, its HTTP server and (optionally) leader election, wired
together. `gpupool scheduler` runs one against a real cluster; tests run several against the memory one."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from gpupool.cluster.port import ClusterPort
from gpupool.scheduler.app import RouteFactory, create_app
from gpupool.scheduler.auth import server_security
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.leader import LeaderElector
from gpupool.scheduler.metrics import SchedulerMetrics
from gpupool.scheduler.server import ServerHandle, serve_in_background
from gpupool.scheduler.service import ExtenderService


@dataclass(slots=True)
class Replica:
    service: ExtenderService
    server: ServerHandle
    elector: LeaderElector | None
    elector_task: asyncio.Task[None] | None

    @property
    def url(self) -> str:
        return self.server.url

    async def stop(self) -> None:
        if self.elector_task is not None:
            self.elector_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.elector_task
        await self.server.stop()
        await self.service.stop()


async def start_replica(
    cluster: ClusterPort,
    config: SchedulerConfig,
    metrics: SchedulerMetrics | None = None,
    extra_routes: RouteFactory | None = None,
) -> Replica:
    """Sync the cache, serve HTTP, and campaign for the lease when `config.leader_elect`. A replica that
    wins a term re-lists before it serves (`/readyz` and binds stay refused until then)."""
    security = server_security(config)  # ConfigError before anything starts
    service = ExtenderService(cluster, config, metrics)
    await service.start()
    server = await serve_in_background(create_app(service, extra_routes), config.host, config.port, security=security)
    if not config.leader_elect:
        return Replica(service, server, None, None)

    async def started() -> None:
        service.leading = False
        await service.resync()  # a new term never trusts the cache of an old one
        service.leading = True

    async def stopped() -> None:
        service.leading = False

    elector = LeaderElector(
        cluster,
        config.lease_namespace,
        config.lease_name,
        config.identity,
        config.lease_duration_s,
        config.renew_deadline_s,
        config.retry_period_s,
        on_started=started,
        on_stopped=stopped,
    )
    return Replica(service, server, elector, asyncio.create_task(elector.run()))
