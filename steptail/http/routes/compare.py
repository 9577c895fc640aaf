"""/api/compare?arm=A&control=C[&tolerance=&rel=&buckets=&from=&to=]: the page's arm-vs-control
Δ (of steps from..to when zoomed) and config diff (storage/page_compare.py, the CLI `compare`'s logic); tagged by both runs' states
and kept in the body cache like a run's routes."""

from __future__ import annotations

import math

from aiohttp import web

from steptail.http.answers import ApiError, dumps, etag, matches, tagged
from steptail.http.keys import BODIES, CONNECTIONS, READS, STORE
from steptail.http.requests import INT32_MAX, impossible_run, int_param
from steptail.storage.api_reads import run_state
from steptail.storage.page_compare import compared
from steptail.storage.page_series import BUCKETS_MAX

BUCKETS_DEFAULT = 1000


def _run_param(request: web.Request, name: str) -> str:
    run = request.query.get(name)
    if not run:
        raise ApiError(400, f"{name} is needed: a run's name")
    if impossible_run(run) is not None:
        raise ApiError(404, f"no run {run!r}")
    return run


def _float_param(request: web.Request, name: str, default: float) -> float:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ApiError(400, f"{name} must be a number") from None
    if not math.isfinite(value) or value < 0:
        raise ApiError(400, f"{name} must be a finite number, at least 0")
    return value


async def compare(request: web.Request) -> web.Response:
    # parameters first: a bad one is a 400 before the store is asked anything
    arm, control = _run_param(request, "arm"), _run_param(request, "control")
    asked = (_float_param(request, "tolerance", 1e-3), _float_param(request, "rel", 0.0),
             int_param(request, "buckets", BUCKETS_DEFAULT, 1, BUCKETS_MAX),
             int_param(request, "from", None, -1, INT32_MAX), int_param(request, "to", None, -1, INT32_MAX))
    if asked[3] is not None and asked[4] is not None and asked[3] > asked[4]:
        raise ApiError(400, "from must not be greater than to")
    if arm == control:
        raise ApiError(400, "arm and control must be two runs")
    answer = await request.app[READS].run(request.app[CONNECTIONS].call, _compare, request.app,
                                          arm, control, asked, request.headers.get("If-None-Match"))
    if isinstance(answer, str):
        raise ApiError(404, f"no run {answer!r}")
    return tagged(*answer)


def _compare(conn, app, arm: str, control: str, asked: tuple, if_none_match: str | None):
    """As routes/steps.py: the states read before the body (a commit in between makes the tag
    older than the body, never newer). A missing run: its name."""
    states = []
    for run in (arm, control):
        state = run_state(conn, run)
        if state is None:
            return run
        states.append(state)
    tag = etag("compare", arm, control, asked, states)
    if matches(if_none_match, tag):
        return tag, None
    return tag, app[BODIES].kept("compare", tag,
                                 lambda: dumps(compared(app[STORE], arm, control, *asked)).encode())
