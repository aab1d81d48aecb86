"""Serving a registry over HTTP as a Starlette route, so a service adds `/metrics` with one line."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


def metrics_route(registry: CollectorRegistry, path: str = "/metrics") -> Route:
    """`Route(path)` answering GET with the registry in the text (or OpenMetrics, when asked) format."""

    async def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        # Collecting walks the whole pool; keep it off the event loop so other requests are not held up.
        body = await asyncio.to_thread(encoder, registry)
        return Response(body, media_type=content_type)

    return Route(path, metrics, methods=["GET"])


def create_metrics_app(registry: CollectorRegistry) -> Starlette:
    """A stand-alone app serving only `/metrics` (for the agent, or tests)."""
    return Starlette(routes=[metrics_route(registry)])
