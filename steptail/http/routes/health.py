"""/healthz and /livez: on the event loop, no store call, no lane."""

from __future__ import annotations

from aiohttp import web

from steptail.http.answers import json_response
from steptail.http.keys import PROBE


async def healthz(request: web.Request) -> web.Response:
    problem = request.app[PROBE].problem()
    if problem is not None:
        return json_response({"status": "unavailable", "store": problem}, 503)
    return json_response({"status": "ok"})


async def livez(_request: web.Request) -> web.Response:
    return json_response({"status": "alive"})
