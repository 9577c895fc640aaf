"""/api/overview: the page's runs table."""

from __future__ import annotations

import time

from aiohttp import web

from steptail.http.answers import hashed, tagged
from steptail.http.keys import CONNECTIONS, READS
from steptail.storage.page_reads import LIVE_NS, overview


def _overview(conn, if_none_match: str | None) -> tuple[str, bytes | None]:
    return hashed({"live_seconds": LIVE_NS // 10**9, "runs": overview(conn, time.time_ns())}, if_none_match)


async def runs_overview(request: web.Request) -> web.Response:
    """The page's runs table: each run's state, last step and CE, findings by severity."""
    return tagged(*await request.app[READS].run(request.app[CONNECTIONS].call, _overview,
                                                 request.headers.get("If-None-Match")))
