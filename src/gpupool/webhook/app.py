"""HTTP layer of the webhook: POST /mutate and /validate (AdmissionReview v1), /healthz, /readyz,
/metrics. Thin adapters around `admission`; every bad request gets a status and a reason, and the
server keeps serving the others.

`/mutate/<policy>` and `/validate/<policy>` decide under the named admission policy: the chart points
the webhook entry of each policy's namespaces (selected by label) at its path. The plain paths use the
default policy.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from gpupool.api.logsafe import shown
from gpupool.webhook.admission import ReviewError, Settings, UnknownPolicy, decide, key_of, parse_review, response
from gpupool.webhook.inventory import InventoryView

log = logging.getLogger("gpupool.webhook")


class BodyTooLarge(Exception):
    pass


async def _read_limited(request: Request, limit: int) -> bytes:
    """Read the body, stopping as soon as it exceeds `limit` (never buffers more than limit + 1 chunk)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.reviews = Counter(
            "gpupool_webhook_reviews",
            "AdmissionReviews answered, by webhook and outcome",
            ["webhook", "outcome"],
            registry=registry,
        )
        self.latency = Histogram(
            "gpupool_webhook_review_seconds",
            "Time to decide one AdmissionReview (parsing to answer)",
            ["webhook"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
            registry=registry,
        )


def create_app(
    settings: Settings,
    inventory: InventoryView,
    max_body_bytes: int,
    registry: CollectorRegistry | None = None,
    ready: Callable[[], bool] = lambda: True,
) -> Starlette:
    metrics = Metrics(registry or CollectorRegistry())

    def handler(mutating: bool) -> Callable[[Request], object]:
        name = "mutate" if mutating else "validate"

        async def endpoint(request: Request) -> Response:
            start = time.perf_counter()
            try:
                policy = settings.policy(request.path_params.get("policy"))
            except UnknownPolicy as e:
                # A chart/config mismatch: answered as an error, so the entry's failurePolicy applies.
                metrics.reviews.labels(name, "bad_request").inc()
                log.error("%s: %s", name, e)
                return JSONResponse({"error": str(e)}, status_code=404)
            try:
                body = await _read_limited(request, max_body_bytes)
            except BodyTooLarge:
                metrics.reviews.labels(name, "too_large").inc()
                return JSONResponse({"error": f"body larger than {max_body_bytes} bytes"}, status_code=413)
            except ClientDisconnect:  # the caller left mid-body (or its body came too slowly): nobody to answer
                metrics.reviews.labels(name, "disconnected").inc()
                return Response(status_code=499)
            try:
                review = parse_review(json.loads(body))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                metrics.reviews.labels(name, "bad_request").inc()
                return JSONResponse({"error": f"body is not valid JSON: {e}"}, status_code=400)
            except RecursionError:
                metrics.reviews.labels(name, "bad_request").inc()
                return JSONResponse({"error": "body is not valid JSON: nested too deeply"}, status_code=400)
            except ReviewError as e:
                metrics.reviews.labels(name, "bad_request").inc()
                return JSONResponse({"error": f"not a valid AdmissionReview: {e}"}, status_code=400)
            try:
                decision = decide(review, mutating, settings, inventory.limits, policy)
            except Exception:  # a bug must cost one answer, not the server
                log.exception("%s failed on %s", name, shown(key_of(review)))
                metrics.reviews.labels(name, "error").inc()
                return JSONResponse({"error": "internal error while deciding; see the webhook log"}, 500)
            outcome = "allowed" if decision.allowed else "denied"
            if decision.patch:
                outcome = "patched"
            if not decision.allowed:
                log.info("%s denied %s %s: %s", name, shown(review.operation), shown(key_of(review)),
                         shown(decision.message, 4000))
            metrics.reviews.labels(name, outcome).inc()
            answer = JSONResponse(response(review.uid, decision))
            metrics.latency.labels(name).observe(time.perf_counter() - start)
            return answer

        return endpoint

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(_: Request) -> Response:
        return PlainTextResponse("ready") if ready() else PlainTextResponse("not ready", status_code=503)

    async def metrics_endpoint(_: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/mutate", handler(True), methods=["POST"]),
            Route("/validate", handler(False), methods=["POST"]),
            Route("/mutate/{policy}", handler(True), methods=["POST"]),
            Route("/validate/{policy}", handler(False), methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
        ]
    )
