"""/api/collector-events: the collector's own faults (health, not the run's findings)."""

from __future__ import annotations

from aiohttp import web

from steptail.http.answers import ApiError, json_response
from steptail.http.keys import CONNECTIONS, READS
from steptail.http.requests import impossible_run


def _collector_events(conn, run: str | None) -> dict:
    from steptail.storage.collector_events import read_events

    return {"run": run, "collector_events": read_events(conn, run)}


async def collector_events(request: web.Request) -> web.Response:
    """The collector's own faults (health, not the run's findings; storage.collector_events):
    ?run=NAME, that run's and pod discovery's; without it, all; newest first."""
    run = request.query.get("run") or None
    if run is not None and (why := impossible_run(run)) is not None:
        raise ApiError(400, f"run: {why}")
    return json_response(await request.app[READS].run(request.app[CONNECTIONS].call, _collector_events, run))
