"""/api/runs/<run>/rbf-layers?buckets=N&from=&to=: a run's per-layer REQUIRED_RBF in at most N
buckets of steps, each layer's largest value per bucket (storage/page_rbf.py). The page asks it
only when its RBF panel is opened, for the range on screen; tagged by the run's state and the
query, kept in the body cache like /series."""

from __future__ import annotations

from aiohttp import web

from steptail.http.answers import ApiError, dumps, etag, matches
from steptail.http.body_cache import BodyCache
from steptail.http.keys import BODIES
from steptail.http.requests import INT32_MAX, int_param, possible_run, run_answer
from steptail.storage.api_reads import run_state
from steptail.storage.page_rbf import BUCKETS_MAX, rbf_layers

BUCKETS_DEFAULT = 200


async def run_rbf_layers(request: web.Request) -> web.Response:
    # parameters first: a bad one is a 400 before the store is asked anything
    buckets = int_param(request, "buckets", BUCKETS_DEFAULT, 1, BUCKETS_MAX)
    lo = int_param(request, "from", None, -1, INT32_MAX)
    hi = int_param(request, "to", None, -1, INT32_MAX)
    if lo is not None and hi is not None and lo > hi:
        raise ApiError(400, "from must not be greater than to")
    run = possible_run(request)
    return await run_answer(request, run, _rbf_layers, request.app[BODIES], run, (buckets, lo, hi), request.headers.get("If-None-Match"))


def _rbf_layers(conn, bodies: BodyCache, run: str, asked: tuple, if_none_match: str | None):
    """As routes/series.py: the state read before the body (a commit in between makes the tag
    older than the body, never newer)."""
    state = run_state(conn, run)
    if state is None:
        return None
    tag = etag("rbf-layers", run, asked, state)
    if matches(if_none_match, tag):
        return tag, None
    return tag, bodies.kept("rbf-layers", tag, lambda: dumps({"run": run} | rbf_layers(conn, run, *asked)).encode())
