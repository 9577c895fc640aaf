"""The application: its shared objects (keys.py), the middleware (guard.py) and the route table —
one route, one handler module in routes/."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry

from steptail.http.body_cache import BodyCache, BodyCacheCollector
from steptail.http.guard import guard
from steptail.http.keys import (
    ANSWERING,
    BODIES,
    CONNECTIONS,
    EXPORTS,
    PROBE,
    READS,
    REGISTRY,
    STORE,
    TOKEN,
)
from steptail.http.lanes import EXPORT_LANE, READ_LANE, Lane, LaneCollector, LaneConnections
from steptail.http.metrics import StoreCollector, metrics
from steptail.http.probe import PROBE_INTERVAL, PROBE_STALE, StoreProbe
from steptail.http.routes import (
    collector_events,
    compare,
    export,
    findings,
    goodput,
    health,
    mesh,
    outline,
    overview,
    page,
    rbf_layers,
    run_config,
    runs,
    series,
    step_times,
    steps,
)
from steptail.storage.db import Store

ROUTES = (
    ("/healthz", health.healthz),
    ("/livez", health.livez),
    ("/metrics", metrics),
    ("/api/runs", runs.runs),
    ("/api/runs/{run}/steps", steps.steps),
    ("/api/runs/{run}/findings", findings.findings),
    ("/api/runs/{run}/export", export.export),
    ("/api/runs/{run}/goodput", goodput.goodput),
    ("/api/runs/{run}/outline", outline.run_outline),
    ("/api/runs/{run}/series", series.run_series),
    ("/api/runs/{run}/step-times", step_times.run_step_times),
    ("/api/runs/{run}/rbf-layers", rbf_layers.run_rbf_layers),
    ("/api/runs/{run}/config", run_config.run_config),
    ("/api/overview", overview.runs_overview),
    ("/api/collector-events", collector_events.collector_events),
    ("/api/compare", compare.compare),
    ("/api/mesh", mesh.mesh),
    ("/", page.page),
    ("/static/{name}", page.static),
)


def make_app(store: Store, token: str | None = None, *, export_lane: tuple[int, int, int] = EXPORT_LANE,
             read_lane: tuple[int, int, int] = READ_LANE, probe_interval: float = PROBE_INTERVAL) -> web.Application:
    """The application; lanes are (threads, waiting requests, Retry-After seconds)."""
    app = web.Application(middlewares=[guard])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    app[STORE] = store
    app[TOKEN] = token or None
    app[REGISTRY] = registry
    app[ANSWERING] = set()
    app[PROBE] = StoreProbe(store, probe_interval, max(PROBE_STALE, 3 * probe_interval))
    app[EXPORTS] = Lane("export", *export_lane)
    app[READS] = Lane("read", *read_lane)
    app[CONNECTIONS] = LaneConnections(store)
    app[BODIES] = BodyCache()
    registry.register(LaneCollector(app[EXPORTS], app[READS]))
    registry.register(BodyCacheCollector(app[BODIES]))
    app.cleanup_ctx.append(app[PROBE].context)
    app.on_cleanup.append(_shutdown_lanes)
    for path, handler in ROUTES:
        app.router.add_get(path, handler)
    return app


async def _shutdown_lanes(app: web.Application) -> None:
    app[EXPORTS].shutdown()
    app[READS].shutdown()
    app[CONNECTIONS].close()
