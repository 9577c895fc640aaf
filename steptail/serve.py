"""`steptail serve`: read-only HTTP over the store (health, Prometheus metrics, JSON API).

Every store read runs in a worker thread, so one slow query never blocks the event loop.
When a token is configured, everything but /healthz needs `Authorization: Bearer <token>`."""

from __future__ import annotations

import asyncio
import hmac
import json
import shutil
import tempfile
import time
import zipfile
from pathlib import Path
from urllib.parse import urlencode

import sqlalchemy as sa
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from steptail.jsonsafe import strict
from storage.db import Store
from storage.reads import iter_steps, list_runs, run_exists

PAGE_DEFAULT = 1000
PAGE_MAX = 10_000
STORE = web.AppKey("store", Store)
TOKEN = web.AppKey("token", object)
REGISTRY = web.AppKey("registry", CollectorRegistry)


# -- JSON ------------------------------------------------------------------------------
def _json(data, status: int = 200) -> web.Response:
    try:  # fast path: stored values are finite almost always
        body = json.dumps(data, allow_nan=False, separators=(",", ":"))
    except ValueError:
        body = json.dumps(strict(data), allow_nan=False, separators=(",", ":"))
    return web.Response(text=body, status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message, "status": status}, status)


class ApiError(Exception):
    """An error answered as JSON (the message is not put in the HTTP status line)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# -- middleware: auth and JSON errors ---------------------------------------------------
@web.middleware
async def _guard(request: web.Request, handler):
    token = request.app[TOKEN]
    if token is not None and request.path != "/healthz":
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            resp = _error(401, "bearer token required")
            resp.headers["WWW-Authenticate"] = 'Bearer realm="steptail"'
            return resp
    try:
        return await handler(request)
    except ApiError as exc:
        return _error(exc.status, exc.message)
    except web.HTTPException as exc:
        if exc.status >= 400:
            return _error(exc.status, exc.reason)
        raise


# -- metrics -----------------------------------------------------------------------------
class StoreCollector:
    """Store-derived gauges, read at scrape time (live-run metrics are the follower's)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self):
        last_step = GaugeMetricFamily("steptail_run_last_step", "Last recorded step of the run's "
                                      "latest incarnation", labels=["run"])
        since = GaugeMetricFamily("steptail_run_seconds_since_last_step",
                                  "Seconds since the run's last recorded step", labels=["run"])
        steps = GaugeMetricFamily("steptail_run_steps", "LOSS-PARTS rows recorded", labels=["run"])
        findings = GaugeMetricFamily("steptail_run_findings", "Findings recorded", labels=["run"])
        runs = GaugeMetricFamily("steptail_runs", "Runs in the store")
        now = time.time()
        rows = _metric_rows(self.store)
        runs.add_metric([], len(rows))
        for run, last, last_ts, n_steps, n_findings in rows:
            if last is not None:
                last_step.add_metric([run], last)
            if last_ts is not None:
                since.add_metric([run], now - last_ts / 1e9)
            steps.add_metric([run], n_steps or 0)
            findings.add_metric([run], n_findings or 0)
        yield from (runs, last_step, since, steps, findings)


_METRICS_SQL = """
SELECT r.run,
  (SELECT l.step FROM loss_parts l WHERE l.run = r.run
   ORDER BY l.incarnation DESC, l.step DESC LIMIT 1) AS last_step,
  (SELECT MAX(l.ts_ns) FROM loss_parts l WHERE l.run = r.run) AS last_ts,
  (SELECT COUNT(*) FROM loss_parts l WHERE l.run = r.run) AS steps,
  (SELECT COUNT(*) FROM findings f WHERE f.run = r.run) AS findings
FROM runs r ORDER BY r.run
"""


def _metric_rows(store: Store) -> list[tuple]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(_METRICS_SQL))]


# -- handlers ------------------------------------------------------------------------------
async def healthz(request: web.Request) -> web.Response:
    store = request.app[STORE]

    def ping() -> None:
        with store.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    try:
        await asyncio.to_thread(ping)
    except sa.exc.SQLAlchemyError:
        return _json({"status": "unavailable", "store": "unreachable"}, 503)
    return _json({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    body = await asyncio.to_thread(generate_latest, request.app[REGISTRY])
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return resp


async def runs(request: web.Request) -> web.Response:
    return _json({"runs": await asyncio.to_thread(list_runs, request.app[STORE])})


async def _known_run(request: web.Request) -> str:
    run = request.match_info["run"]
    if not await asyncio.to_thread(run_exists, request.app[STORE], run):
        raise ApiError(404, f"no run {run!r}")
    return run


def _int_param(request: web.Request, name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"{name} must be an integer") from None
    if not lo <= value <= hi:
        raise ApiError(400, f"{name} must be between {lo} and {hi}")
    return value


async def steps(request: web.Request) -> web.Response:
    run = await _known_run(request)
    big = 2**31 - 1
    lo = _int_param(request, "from", None, -1, big)
    hi = _int_param(request, "to", None, -1, big)
    offset = _int_param(request, "offset", 0, 0, 2**62)
    limit = _int_param(request, "limit", PAGE_DEFAULT, 1, PAGE_MAX)
    after = _after_param(request)
    store = request.app[STORE]
    # One row more than asked tells whether another page follows.
    rows = await asyncio.to_thread(
        lambda: list(iter_steps(store, run, lo, hi, offset, limit + 1, after=after)))
    more = len(rows) > limit
    rows = rows[:limit]
    nxt = None
    if more:  # the next page resumes behind the last row (keyset): constant cost per page
        query = {k: v for k, v in (("from", lo), ("to", hi)) if v is not None}
        query |= {"after": f"{rows[-1]['incarnation']}:{rows[-1]['step']}", "limit": limit}
        nxt = f"{request.path}?{urlencode(query)}"
    return _json({"run": run, "from": lo, "to": hi, "offset": offset, "limit": limit,
                  "count": len(rows), "next": nxt, "steps": rows})


def _after_param(request: web.Request) -> tuple[int, int] | None:
    raw = request.query.get("after")
    if raw is None:
        return None
    inc, colon, step = raw.partition(":")
    if not colon or not inc.isdigit() or not step.isdigit():
        raise ApiError(400, "after must be INCARNATION:STEP")
    return int(inc), int(step)


def _findings(store: Store, run: str) -> list[dict]:
    with store.engine.connect() as conn:
        try:
            from steptail.findings import load_findings
        except ImportError:
            rows = conn.execute(sa.text(
                "SELECT kind, incarnation, first_step, last_step, detail, severity, detected_ns"
                " FROM findings WHERE run = :run ORDER BY detected_ns, kind"), {"run": run})
            from parsers import format_ns

            return [{"run": run, "kind": k, "incarnation": i, "first_step": a, "last_step": b,
                     "detail": d, "severity": s, "detected_at": format_ns(t)}
                    for k, i, a, b, d, s, t in rows]
        return [f.to_event() for f in load_findings(conn, run)]


async def findings(request: web.Request) -> web.Response:
    run = await _known_run(request)
    return _json({"run": run, "findings": await asyncio.to_thread(_findings, request.app[STORE], run)})


def _bundle(store: Store, run: str, work: Path) -> Path:
    """Export RUN into WORK and zip it (files at the archive's top, under RUN/)."""
    from storage.export import export_run

    folder = work / run
    export_run(store, run, folder)
    archive = work / f"{run}.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(folder.iterdir()):
            zf.write(path, f"{run}/{path.name}")
    return archive


async def export(request: web.Request) -> web.StreamResponse:
    run = await _known_run(request)
    work = Path(tempfile.mkdtemp(prefix="steptail-export-"))
    try:
        archive = await asyncio.to_thread(_bundle, request.app[STORE], run, work)
        resp = web.StreamResponse(headers={
            "Content-Type": "application/zip",
            "Content-Disposition": f'attachment; filename="{run}.zip"',
            "Content-Length": str(archive.stat().st_size),
        })
        await resp.prepare(request)
        with archive.open("rb") as fh:
            while chunk := await asyncio.to_thread(fh.read, 1 << 20):
                await resp.write(chunk)
        await resp.write_eof()
        return resp
    finally:
        await asyncio.to_thread(shutil.rmtree, work, True)


def make_app(store: Store, token: str | None = None) -> web.Application:
    app = web.Application(middlewares=[_guard])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    app[STORE] = store
    app[TOKEN] = token or None
    app[REGISTRY] = registry
    r = app.router
    r.add_get("/healthz", healthz)
    r.add_get("/metrics", metrics)
    r.add_get("/api/runs", runs)
    r.add_get("/api/runs/{run}/steps", steps)
    r.add_get("/api/runs/{run}/findings", findings)
    r.add_get("/api/runs/{run}/export", export)
    return app


async def serve(store: Store, host: str, port: int, token: str | None,
                started=None, stop: asyncio.Event | None = None) -> None:
    """Run until `stop` is set (or the task is cancelled); `started(url)` once listening."""
    runner = web.AppRunner(make_app(store, token), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = site._server.sockets[0].getsockname()  # the real port when port=0
        if started:
            h = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
            started(f"http://{h}:{bound[1]}")
        await (stop or asyncio.Event()).wait()
    finally:
        await runner.cleanup()
