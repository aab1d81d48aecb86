"""Serving metrics over HTTP as a Starlette route, so a service adds `/metrics` with one line.

    registry = CollectorRegistry()                       # the service's own metrics
    pool = PoolCollector(provider)                       # NOT registered: handed to the route
    routes.append(metrics_route(registry, pool=pool))

With `pool`, the snapshot provider runs on the event loop (where the scheduler's state is consistent)
and everything else (encoding the registry and ~100,000 pool series) runs in a worker thread, so the
scheduler keeps answering kube-scheduler while a large pool is scraped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gpupool.exporter.pool import PoolCollector, PoolFrame

_EOF = b"# EOF\n"


class _Fixed:
    """A collector returning families computed beforehand."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> list[Metric]:
        return self._families


def render(registry: CollectorRegistry, frame: PoolFrame | None, accept: str) -> tuple[bytes, str]:
    """The body and content type for one scrape: the registry, then the pool frame (if any)."""
    encoder, content_type = choose_encoder(accept)
    parts = [encoder(registry)]
    if frame is not None:
        small = CollectorRegistry(auto_describe=False)
        small.register(_Fixed(frame.small_families()))
        parts.append(encoder(small))
        if frame.snapshot is not None:
            parts.append(frame.labelled_text().encode())
    if content_type.startswith("application/openmetrics-text"):
        # OpenMetrics ends with exactly one EOF marker: drop the per-part ones and close once.
        parts = [p.removesuffix(_EOF) for p in parts] + [_EOF]
    return b"".join(parts), content_type


def metrics_route(registry: CollectorRegistry, pool: PoolCollector | None = None, path: str = "/metrics") -> Route:
    """`Route(path)` answering GET with `registry` (and `pool`, when given and not registered in it), in
    the text format or OpenMetrics when the scraper asks for it."""

    async def metrics(request: Request) -> Response:
        frame = pool.take() if pool is not None else None
        body, content_type = await asyncio.to_thread(render, registry, frame, request.headers.get("accept", ""))
        return Response(body, media_type=content_type)

    return Route(path, metrics, methods=["GET"])


def create_metrics_app(registry: CollectorRegistry, pool: PoolCollector | None = None) -> Starlette:
    """A stand-alone app serving only `/metrics` (for the agent, or tests)."""
    return Starlette(routes=[metrics_route(registry, pool)])
