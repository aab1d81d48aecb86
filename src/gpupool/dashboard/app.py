"""The web dashboard: a Starlette app meant to be mounted at /ui by the scheduler or the demo.

    app.mount("/ui", create_dashboard(provider, sim_results_dir=Path("sim-out")))

Pages are rendered on the server (Jinja2); the vendored htmx polls a fragment endpoint to keep the pool
view live, so there is no JavaScript build and no CDN. Routes, relative to the mount point:

    /                  the pool: summary, node x GPU map with each pod's share, pending pods, search (?q=)
    /fragment          the live part of that page (what htmx polls)
    /api/snapshot      the snapshot as JSON
    /simulation        the report of a `gpupool simulate` run (results.json + allocation.png)
    /static/...        htmx and the stylesheet
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from jinja2 import Environment, PackageLoader
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from gpupool.api.snapshot import Snapshot
from gpupool.dashboard.simulation import SimulationError, load_results
from gpupool.dashboard.view import pool_view

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
MAX_QUERY = 200  # characters of a search; longer input is cut rather than rejected


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("gpupool.dashboard", "templates"),
        # Every template is HTML and every name in it comes from tenants or scheduler callers: escape all
        # of them, whatever the template's file name (select_autoescape would skip a .txt or .j2 file).
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["pct"] = lambda v, digits=1: f"{100 * v:.{digits}f} %"
    # One decimal at most: a GPU's usable memory is rarely a round number of GiB (44.9883 GiB says nothing more).
    env.filters["gib"] = lambda mib: f"{round(mib / 1024, 1):g} GiB"
    return env


def create_dashboard(
    snapshot_provider: Callable[[], Snapshot],
    sim_results_dir: Path | str | None = None,
    refresh_s: float = 2.0,
    max_nodes: int = 100,
    cache_s: float = 1.0,
) -> Starlette:
    """The dashboard app. `snapshot_provider` is called on the event loop (it must be quick and must not
    block on I/O); rendering then runs in a worker thread. A snapshot is reused for `cache_s` seconds, so
    that many open pages polling together cost one snapshot, not one each. The pool map lists at most
    `max_nodes` nodes unless the page is opened with `?all=1` (a search narrows it first), so that a
    1,000-node pool does not ship megabytes every refresh."""
    env = _environment()
    sim_dir = Path(sim_results_dir) if sim_results_dir is not None else None
    refresh = max(0.5, float(refresh_s))

    def base(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    async def render(name: str, status: int = 200, **context: object) -> HTMLResponse:
        template = env.get_template(name)
        html = await asyncio.to_thread(template.render, **context)
        return HTMLResponse(html, status_code=status)

    cached: list[tuple[float, Snapshot]] = []  # (monotonic time taken, snapshot); at most one

    def snapshot() -> Snapshot | None:
        now = time.monotonic()
        if cached and now - cached[0][0] < cache_s:
            return cached[0][1]
        try:
            snap = snapshot_provider()
        except Exception:
            log.exception("pool snapshot provider failed")
            return None  # failures are not cached: the next request tries again
        cached[:] = [(now, snap)]
        return snap

    def query(request: Request) -> tuple[str, bool]:
        return request.query_params.get("q", "").strip()[:MAX_QUERY], request.query_params.get("all") == "1"

    async def page(request: Request) -> Response:
        q, show_all = query(request)
        snap = snapshot()
        view = pool_view(snap, q, 0 if show_all else max_nodes) if snap is not None else None
        return await render("pool.html", status=200 if snap else 503, base=base(request), q=q, view=view,
                            refresh=refresh, page="pool", show_all=show_all)

    async def fragment(request: Request) -> Response:
        q, show_all = query(request)
        snap = snapshot()
        view = pool_view(snap, q, 0 if show_all else max_nodes) if snap is not None else None
        return await render("_pool.html", status=200 if snap else 503, base=base(request), q=q, view=view,
                            show_all=show_all)

    async def api_snapshot(request: Request) -> Response:
        snap = snapshot()
        if snap is None:
            return Response('{"error": "pool snapshot not available"}', status_code=503,
                            media_type="application/json")
        return Response(snap.model_dump_json(), media_type="application/json")

    async def simulation(request: Request) -> Response:
        report, error, status = None, None, 200
        if sim_dir is None:
            error, status = ("No simulation results configured: start the service with a results directory "
                             "(written by `gpupool simulate --out DIR`)."), 404
        else:
            try:
                report = load_results(sim_dir)
            except FileNotFoundError as e:
                error, status = str(e), 404
            except SimulationError as e:
                error, status = str(e), 500
        return await render("simulation.html", status=status, base=base(request), page="simulation",
                            report=report, error=error)

    async def simulation_plot(request: Request) -> Response:
        png = sim_dir / "allocation.png" if sim_dir is not None else None
        if png is None or not png.is_file():
            return Response("no allocation.png in the simulation results directory", status_code=404,
                            media_type="text/plain")
        return FileResponse(png, media_type="image/png")

    return Starlette(
        routes=[
            Route("/", page),
            Route("/fragment", fragment),
            Route("/api/snapshot", api_snapshot),
            Route("/simulation", simulation),
            Route("/simulation/allocation.png", simulation_plot),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
    )
