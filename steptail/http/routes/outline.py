"""/api/runs/<run>/outline: incarnations, restore points, checkpoints, missing steps, stream gaps."""

from __future__ import annotations

from aiohttp import web

from steptail.http.answers import dumps, etag, matches
from steptail.http.body_cache import BodyCache
from steptail.http.keys import BODIES, STORE
from steptail.http.requests import possible_run, run_answer
from steptail.storage.api_reads import run_state
from steptail.storage.db import Store
from steptail.storage.page_reads import outline


def _outline(conn, bodies: BodyCache, store: Store, run: str,
             if_none_match: str | None) -> tuple[str, bytes | None] | None:
    """As _steps: tagged by the run's state, read (on the lane's connection) before the body. The
    body on a connection of its own: its pass over the steps streams, which PostgreSQL does in a
    transaction (the lane's connections are in autocommit)."""
    state = run_state(conn, run)
    if state is None:
        return None
    tag = etag("outline", run, state)
    if matches(if_none_match, tag):
        return tag, None
    def make() -> bytes | None:
        with store.engine.connect() as own:
            data = outline(own, run)
        return None if data is None else dumps(data).encode()

    body = bodies.kept("outline", tag, make)
    return None if body is None else (tag, body)


async def run_outline(request: web.Request) -> web.Response:
    """A run's incarnations, restore points, checkpoints, missing steps and stream gaps."""
    run = possible_run(request)
    return await run_answer(request, run, _outline, request.app[BODIES], request.app[STORE], run, request.headers.get("If-None-Match"))
