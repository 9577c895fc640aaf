"""/ and /static/<name>: the web page's files (steptail/web), gzipped when the client takes it,
answered 304 by ETag; the page itself reads the JSON API."""

from __future__ import annotations

import asyncio

from aiohttp import web

from steptail.http.answers import ApiError, matches
from steptail.web import PAGE_HEADERS, MissingLibrary, asset


def _accepts_gzip(request: web.Request) -> bool:
    for item in request.headers.get("Accept-Encoding", "").split(","):
        name, _, params = item.partition(";")
        if name.strip().lower() == "gzip":
            q = params.strip().lower()
            if not q.startswith("q="):
                return True
            try:
                return float(q[2:]) > 0
            except ValueError:
                return False
    return False


async def _asset(request: web.Request, name: str) -> web.Response:
    try:
        found = await asyncio.to_thread(asset, name)  # read (and compressed) once, then cached
    except MissingLibrary as exc:
        raise ApiError(500, str(exc)) from None
    if found is None:
        raise ApiError(404, f"no file {name!r}")
    headers = {"ETag": found.etag, "Cache-Control": "no-cache", "Vary": "Accept-Encoding",
               "X-Content-Type-Options": "nosniff"}
    if name == "index.html":
        headers |= PAGE_HEADERS
    if matches(request.headers.get("If-None-Match"), found.etag):
        return web.Response(status=304, headers=headers)
    body = found.body
    if _accepts_gzip(request):
        body, headers["Content-Encoding"] = found.gzipped, "gzip"
    return web.Response(body=body, headers=headers, content_type=found.content_type, charset="utf-8")


async def page(request: web.Request) -> web.Response:
    return await _asset(request, "index.html")


async def static(request: web.Request) -> web.Response:
    return await _asset(request, request.match_info["name"])
