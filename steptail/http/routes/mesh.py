"""/api/mesh: the measured mesh table (`steptail mesh --json`)."""

from __future__ import annotations

from aiohttp import web

from steptail.http.answers import ApiError, json_response
from steptail.http.keys import CONNECTIONS, READS


def _mesh(conn, pattern: str | None, since_ns: int | None, until_ns: int | None) -> dict:
    from steptail.storage.mesh import mesh_on

    return {"mesh": mesh_on(conn, pattern, since_ns, until_ns)}


async def mesh(request: web.Request) -> web.Response:
    """`steptail mesh --json` as {"mesh": [...]}; ?run=GLOB&since=&until= (ISO 8601)."""
    from steptail.storage.mesh import iso_ns

    bounds = []
    for name in ("since", "until"):
        raw = request.query.get(name)
        try:
            bounds.append(None if raw is None else iso_ns(raw))
        except ValueError:
            raise ApiError(400, f"{name} must be an ISO 8601 time") from None
    data = await request.app[READS].run(request.app[CONNECTIONS].call, _mesh, request.query.get("run"), *bounds)
    return json_response(data)
