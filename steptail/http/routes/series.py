"""/api/runs/<run>/series?buckets=N&from=&to=: a run's CE downsampled into at most N buckets
per incarnation (min, max, last, NaN, timestamps, REQUIRED_RBF rows unless `rbf=0`;
storage/page_series.py),
so that the page's first draw costs the same for any run length; tagged by the run's state
and kept in the body cache like /steps."""

from __future__ import annotations

from aiohttp import web

from steptail.http.answers import ApiError, dumps, etag, matches
from steptail.http.body_cache import BodyCache
from steptail.http.keys import BODIES
from steptail.http.requests import INT32_MAX, int_param, possible_run, run_answer
from steptail.storage.api_reads import run_state
from steptail.storage.page_series import BUCKETS_MAX, series

BUCKETS_DEFAULT = 1000


async def run_series(request: web.Request) -> web.Response:
    # parameters first: a bad one is a 400 before the store is asked anything
    buckets = int_param(request, "buckets", BUCKETS_DEFAULT, 1, BUCKETS_MAX)
    lo = int_param(request, "from", None, -1, INT32_MAX)
    hi = int_param(request, "to", None, -1, INT32_MAX)
    rbf = bool(int_param(request, "rbf", 1, 0, 1))  # 0: no REQUIRED_RBF counts (the page's first draw)
    if lo is not None and hi is not None and lo > hi:
        raise ApiError(400, "from must not be greater than to")
    run = possible_run(request)
    return await run_answer(request, run, _series, request.app[BODIES], run, (buckets, lo, hi, rbf), request.headers.get("If-None-Match"))


def _series(conn, bodies: BodyCache, run: str, asked: tuple, if_none_match: str | None):
    """As routes/steps.py: the state read before the body, so a commit in between makes the tag
    older than the body, never newer."""
    state = run_state(conn, run)
    if state is None:
        return None
    tag = etag("series", run, asked, state)
    if matches(if_none_match, tag):
        return tag, None
    return tag, bodies.kept("series", tag, lambda: dumps({"run": run} | series(conn, run, *asked)).encode())
