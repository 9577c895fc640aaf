"""/api/runs/<run>/step-times?buckets=N: the run's step time, tokens/s and TFLOP/s per device
by incarnation, in at most N buckets of steps (storage/page_series.step_times); tagged by the
run's state and kept in the body cache like /series."""

from __future__ import annotations

from aiohttp import web

from steptail.http.answers import dumps, etag, matches
from steptail.http.body_cache import BodyCache
from steptail.http.keys import BODIES
from steptail.http.requests import int_param, possible_run, run_answer
from steptail.storage.api_reads import run_state
from steptail.storage.page_series import BUCKETS_MAX, step_times

BUCKETS_DEFAULT = 1000


async def run_step_times(request: web.Request) -> web.Response:
    buckets = int_param(request, "buckets", BUCKETS_DEFAULT, 1, BUCKETS_MAX)  # a 400 before the store is asked
    run = possible_run(request)
    return await run_answer(request, run, _step_times, request.app[BODIES], run, buckets, request.headers.get("If-None-Match"))


def _step_times(conn, bodies: BodyCache, run: str, buckets: int, if_none_match: str | None):
    state = run_state(conn, run)
    if state is None:
        return None
    tag = etag("step-times", run, buckets, state)
    if matches(if_none_match, tag):
        return tag, None
    return tag, bodies.kept("step-times", tag, lambda: dumps({"run": run} | step_times(conn, run, buckets)).encode())
