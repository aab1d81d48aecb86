"""Composes the pool views (snapshot JSON, Prometheus pool metrics, dashboard) onto a scheduler.

The entry layer does this so that the scheduler, exporter and dashboard services never import each
other: they meet in the pool snapshot (gpupool.api.snapshot)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route

from gpupool.api.inventory import InventoryDoc
from gpupool.api.snapshot import QueueView, Snapshot, build_snapshot
from gpupool.core.model import MILLI_PER_GPU
from gpupool.core.queues import UNLIMITED, QueueStatus, Quota
from gpupool.dashboard.app import create_dashboard
from gpupool.exporter.http import metrics_route
from gpupool.exporter.pool import PoolCollector
from gpupool.scheduler.app import RouteFactory
from gpupool.scheduler.queue_status import current as current_queues
from gpupool.scheduler.service import ExtenderService


def snapshot_of(service: ExtenderService) -> Snapshot:
    ledger = service.ledger
    pending = dict(service.pending)
    snap = build_snapshot(
        ledger.state,
        {key: why for key, (why, _) in pending.items()},
        names={uid: entry.key for uid, entry in ledger.entries.items()},
        containers={uid: entry.containers for uid, entry in ledger.entries.items()},
        pending_since={key: since for key, (_, since) in pending.items()},
        now=service.clock(),
        servers={name: (doc.remote_server, doc.remote_shares) for name, doc in ledger.inventories.items()
                 if doc.remote_server},
        partitions=partitions_of(ledger.inventories.values()),
    )
    if not service.queues.enabled:
        return snap
    return snap.model_copy(update={"queues": [queue_view(s) for s in current_queues(service.queues, pending)]})


def partitions_of(inventories: Iterable[InventoryDoc]) -> dict[str, list[tuple[str, int, bool]]]:
    """GPU UUID -> the hardware partitions its node's agent reports (profile, start, used). Every vendor's
    partitions travel in the inventory's `mig` / `mig_instances` (MIG instances, AMD partitions, vNPUs)."""
    return {g.uuid: [(i.profile, i.start, i.used) for i in g.mig_instances]
            for doc in inventories for g in doc.gpus if g.mig}


def queue_view(s: QueueStatus) -> QueueView:
    def gpus(q: Quota) -> float:
        return q.gpu_milli / MILLI_PER_GPU

    limit = None if s.maximum.gpu_milli >= UNLIMITED // 2 else gpus(s.maximum)
    return QueueView(name=s.name, used_gpus=gpus(s.usage), guaranteed_gpus=gpus(s.guaranteed), maximum_gpus=limit,
                     borrowed_gpus=gpus(s.borrowed), lent_gpus=gpus(s.lent), pending=s.pending)


def pool_views(sim_results_dir: Path | None = None) -> RouteFactory:
    """Routes for GET /pool (snapshot JSON), GET /metrics (scheduler and pool series) and /ui."""

    def routes(service: ExtenderService) -> Sequence[BaseRoute]:
        def provider() -> Snapshot:
            return snapshot_of(service)

        async def pool(request: Request) -> Response:
            return Response(provider().model_dump_json(), media_type="application/json")

        return [
            Route("/pool", pool, methods=["GET"]),
            metrics_route(service.metrics.registry, pool=PoolCollector(provider)),
            Mount("/ui", create_dashboard(provider, sim_results_dir=sim_results_dir)),
        ]

    return routes
