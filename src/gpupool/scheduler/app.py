"""HTTP face of the extender (Starlette): thin handlers around `ExtenderService` (whose verbs are adapters
over the scheduling framework, gpupool.scheduler.extender).

Bad input never reaches the service: malformed JSON is a 400 naming the problem, a body over the limit is
a 413, and an unexpected error answers 500 for that request only.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from gpupool.api.extender import (
    ExtenderRequestError,
    dump_priorities,
    parse_args,
    parse_binding_args,
    parse_preemption_args,
)
from gpupool.scheduler.service import ExtenderService

log = logging.getLogger(__name__)

_JSON = "application/json"


class BodyTooLarge(Exception):
    pass


async def _body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _error(status: int, message: str) -> Response:
    return JSONResponse({"Error": message}, status_code=status)


RouteFactory = Callable[[ExtenderService], Sequence[BaseRoute]]


def create_app(service: ExtenderService, extra_routes: RouteFactory | None = None) -> Starlette:
    """The extender's app. `extra_routes` (built by the entry layer, e.g. the pool views) come first, so
    they may replace a default route such as /metrics."""
    limit = service.config.max_body_bytes
    metrics = service.metrics

    def verb(name: str, handle: Callable[[bytes], Awaitable[bytes]]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            start = time.perf_counter()
            try:
                body = await _body(request, limit)
                response = Response(await handle(body), media_type=_JSON)
            except ClientDisconnect:
                response = Response(status_code=499)  # nobody is listening any more
            except BodyTooLarge as e:
                response = _error(413, str(e))
            except ExtenderRequestError as e:
                response = _error(400, str(e))
            except Exception as e:  # one bad request must not take the service down
                log.exception("%s failed", name)
                response = _error(500, f"internal error in {name}: {e}")
            metrics.requests.labels(name, str(response.status_code)).inc()
            metrics.latency.labels(name).observe(time.perf_counter() - start)
            return response

        return endpoint

    async def do_filter(body: bytes) -> bytes:
        return (await service.filter(parse_args(body))).model_dump_json().encode()

    async def do_prioritize(body: bytes) -> bytes:
        return dump_priorities(await service.prioritize(parse_args(body)))

    async def do_bind(body: bytes) -> bytes:
        return (await service.bind(parse_binding_args(body))).model_dump_json().encode()

    async def do_preempt(body: bytes) -> bytes:
        return (await service.preempt(parse_preemption_args(body))).model_dump_json().encode()

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        if service.ready:
            return PlainTextResponse("ready")
        why = "cache not synced" if not service.synced else "not the leader"
        return PlainTextResponse(f"not ready: {why}", status_code=503)

    async def prom(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def debug_ledger(request: Request) -> Response:
        return Response(json.dumps(await service.debug_ledger(), indent=1), media_type=_JSON)

    return Starlette(
        routes=[
            *(extra_routes(service) if extra_routes is not None else ()),
            Route("/filter", verb("filter", do_filter), methods=["POST"]),
            Route("/prioritize", verb("prioritize", do_prioritize), methods=["POST"]),
            Route("/bind", verb("bind", do_bind), methods=["POST"]),
            Route("/preempt", verb("preempt", do_preempt), methods=["POST"]),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", prom),
            Route("/debug/ledger", debug_ledger),
        ]
    )
