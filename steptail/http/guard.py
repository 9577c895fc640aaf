"""The middleware every request passes: the bearer token (when configured) for everything but
the probes and the page's static files, a path that is UTF-8, and JSON for every failure (no
traceback; the request path logged escaped, so a `%0a` in it cannot forge a log line)."""

from __future__ import annotations

import asyncio
import hmac
import logging

from aiohttp import web

from steptail.http.answers import ApiError, error
from steptail.http.keys import ANSWERING, TOKEN
from steptail.http.requests import check_path
from steptail.runs.names import escaped  # one escaper for every name the CLI prints

# No token needed: the probes, and the page's static files (they hold nothing from the store;
# the page asks for the token and sends it with its API calls). Matched by route, not by path.
OPEN_ROUTES = ("/healthz", "/livez", "/", "/static/{name}")
log = logging.getLogger("steptail.serve")  # the server's one logger, whichever module logs


@web.middleware
async def guard(request: web.Request, handler):
    answering = request.app[ANSWERING]
    answering.add(request.protocol)
    try:
        return await _answer(request, handler)
    finally:
        answering.discard(request.protocol)


async def _answer(request: web.Request, handler):
    token = request.app[TOKEN]
    if token is not None and not _open(request):
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            resp = error(401, "bearer token required")
            resp.headers["WWW-Authenticate"] = 'Bearer realm="steptail"'
            return resp
    try:
        check_path(request)
        return await handler(request)
    except ApiError as exc:
        resp = error(exc.status, exc.message)
        resp.headers.update(exc.headers)
        return resp
    except web.HTTPException as exc:
        if exc.status >= 400:
            return error(exc.status, exc.reason)
        raise
    except (asyncio.CancelledError, ConnectionError):
        raise  # the client went away: nothing to answer
    except Exception as exc:  # noqa: BLE001 - one line in the log, JSON to the client
        text = str(exc).strip()
        log.error("%s %s failed: %s: %s", request.method, escaped(request.raw_path), type(exc).__name__,
                  escaped(text.splitlines()[0][:200]) if text else "''")
        return error(500, "internal error")


def _open(request: web.Request) -> bool:
    """Whether the request's route needs no token (by the route it matched: a path such as
    `/static/../api/runs` matches no open route)."""
    resource = request.match_info.route.resource
    return resource is not None and resource.canonical in OPEN_ROUTES
