"""/api/runs/<run>/steps: a run's steps a page at a time (keyset `next` links), only the asked
fields, answered 304 or from the body cache while the run is unchanged."""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import urlencode

from aiohttp import web

from steptail.http.answers import ApiError, dumps, etag, matches
from steptail.http.body_cache import BodyCache
from steptail.http.keys import BODIES
from steptail.http.requests import INT32_MAX, INTEGER, int_param, integer, possible_run, run_answer
from steptail.storage.api_reads import KEYS as STEP_FIELDS
from steptail.storage.api_reads import run_state, step_rows, steps_json

PAGE_DEFAULT = 1000
PAGE_MAX = 10_000


async def steps(request: web.Request) -> web.Response:
    # parameters first: a bad one is a 400 before the store is asked anything
    lo = int_param(request, "from", None, -1, INT32_MAX)
    hi = int_param(request, "to", None, -1, INT32_MAX)
    if lo is not None and hi is not None and lo > hi:
        raise ApiError(400, "from must not be greater than to")
    page = _Page(request.path, lo, hi, int_param(request, "offset", 0, 0, 2**62),
                 int_param(request, "limit", PAGE_DEFAULT, 1, PAGE_MAX), _after_param(request),
                 _fields_param(request))
    run = possible_run(request)
    # one lane job, one connection: the run's state, then the page only when it changed
    return await run_answer(request, run, _steps, request.app[BODIES], run, page, request.query_string, request.headers.get("If-None-Match"))


class _Page(NamedTuple):
    """What a /steps request asks for (its path makes the `next` link)."""

    path: str
    lo: int | None
    hi: int | None
    offset: int
    limit: int
    after: tuple[int, int] | None
    fields: tuple[str, ...] | None  # None: every field


def _steps(conn, bodies: BodyCache, run: str, page: _Page, query: str, if_none_match: str | None):
    """(ETag, body or None when the client has it), or None when there is no such run. The
    state is read before the rows: a commit in between makes the tag older than the body (one
    more 200 later), never newer (a client kept on stale rows). A body is kept by its tag: the
    same page of an unchanged run costs the state's query, not the rows'."""
    state = run_state(conn, run)
    if state is None:
        return None
    tag = etag(run, query, state)
    if matches(if_none_match, tag):
        return tag, None
    return tag, bodies.kept("steps", tag, lambda: _steps_page(conn, run, page))


def _steps_page(conn, run: str, page: _Page) -> bytes:
    path, lo, hi, offset, limit, after, fields = page
    rows = step_rows(conn, run, lo, hi, offset, limit + 1, after, fields)  # one more: is there a next page?
    nxt = None
    if len(rows) > limit:  # the next page resumes behind the last row (keyset): constant cost per page
        rows = rows[:limit]
        query = {k: v for k, v in (("from", lo), ("to", hi)) if v is not None}
        query |= {"after": f"{rows[-1][0]}:{rows[-1][1]}", "limit": limit}
        if fields is not None:
            query["fields"] = ",".join(fields)
        nxt = f"{path}?{urlencode(query, safe=',')}"
    head = dumps({"run": run, "from": lo, "to": hi, "offset": offset, "limit": limit,
                   "count": len(rows), "next": nxt})
    return b"".join((head[:-1].encode(), b',"steps":', steps_json(rows, fields), b"}"))


def _fields_param(request: web.Request) -> tuple[str, ...] | None:
    """`fields=ce,ts`: only these of each step (incarnation and step always, they are its key),
    in the order of a whole step; a page of steps and CE alone is a tenth of a whole one."""
    raw = request.query.get("fields")
    if raw is None:
        return None
    asked = {f.strip() for f in raw.split(",") if f.strip()}
    unknown = asked - set(STEP_FIELDS)
    if unknown:
        raise ApiError(400, f"fields: no field {sorted(unknown)[0]!r}; a step has {', '.join(STEP_FIELDS)}")
    return tuple(k for k in STEP_FIELDS if k in asked or k in ("incarnation", "step"))


def _after_param(request: web.Request) -> tuple[int, int] | None:
    raw = request.query.get("after")
    if raw is None:
        return None
    inc, colon, step = raw.partition(":")
    if not colon or not INTEGER.match(inc) or not INTEGER.match(step):
        raise ApiError(400, "after must be INCARNATION:STEP")
    return integer("after's incarnation", inc, 0, INT32_MAX), integer("after's step", step, -1, INT32_MAX)
