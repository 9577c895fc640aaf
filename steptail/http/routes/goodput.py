"""/api/runs/<run>/goodput: where the run's time went (docs/goodput.md)."""

from __future__ import annotations

from aiohttp import web

from steptail.http.answers import hashed
from steptail.http.requests import possible_run, run_answer
from steptail.storage.reads import run_exists_on


def _tagged_goodput(conn, run: str, if_none_match: str | None) -> tuple[str, bytes | None] | None:
    from steptail.storage.goodput import timing_on

    if not run_exists_on(conn, run):
        return None
    return hashed(timing_on(conn, run).report(), if_none_match)


async def goodput(request: web.Request) -> web.Response:
    """The fields of `steptail goodput RUN --json` (docs/goodput.md)."""
    run = possible_run(request)
    return await run_answer(request, run, _tagged_goodput, run, request.headers.get("If-None-Match"))
