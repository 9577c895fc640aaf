"""/api/runs: every run's name."""

from __future__ import annotations

from aiohttp import web

from steptail.http.answers import hashed, tagged
from steptail.http.keys import READS, STORE
from steptail.storage.db import Store
from steptail.storage.reads import list_runs


def _runs(store: Store, if_none_match: str | None) -> tuple[str, bytes | None]:
    return hashed({"runs": list_runs(store)}, if_none_match)


async def runs(request: web.Request) -> web.Response:
    return tagged(*await request.app[READS].run(
        _runs, request.app[STORE], request.headers.get("If-None-Match")))
