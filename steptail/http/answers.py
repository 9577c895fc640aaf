"""JSON answers, ETags and the error every handler raises (ApiError): one shape for every route."""

from __future__ import annotations

import hashlib
import json

from aiohttp import web

from steptail.jsonsafe import strict


def dumps(data) -> str:
    try:  # fast path: stored values are finite almost always
        return json.dumps(data, allow_nan=False, separators=(",", ":"))
    except ValueError:
        return json.dumps(strict(data), allow_nan=False, separators=(",", ":"))


def json_response(data, status: int = 200) -> web.Response:
    return web.Response(text=dumps(data), status=status, content_type="application/json")


# -- ETags: a run's routes answer 304 to a client holding the current answer ---------------
# Bumped when a body's format changes: a tag a client kept from before must not match.
BODY_FORMAT = 1


def etag(*parts) -> str:
    key = repr((BODY_FORMAT, *parts)).encode()
    return '"' + hashlib.blake2b(key, digest_size=12).hexdigest() + '"'


def matches(if_none_match: str | None, tag: str) -> bool:
    """If-None-Match's weak comparison (RFC 9110 13.1.2): any listed tag, `W/` or not, or `*`."""
    if not if_none_match:
        return False
    given = {t.strip().removeprefix("W/") for t in if_none_match.split(",")}
    return tag in given or "*" in given


def tagged(tag: str, body: bytes | None) -> web.Response:
    """200 with `body` (JSON), or 304 without a body when `body` is None; clients revalidate
    every time (no-cache), which a 304 makes cheap."""
    headers = {"ETag": tag, "Cache-Control": "no-cache"}
    if body is None:
        return web.Response(status=304, headers=headers)
    return web.Response(body=body, headers=headers, content_type="application/json", charset="utf-8")


def hashed(data, if_none_match: str | None) -> tuple[str, bytes | None]:
    """(ETag, body) of an answer tagged by its own content; body None when the client has it."""
    body = dumps(data).encode()
    tag = etag(body)
    return tag, None if matches(if_none_match, tag) else body


def error(status: int, message: str) -> web.Response:
    return json_response({"error": message, "status": status}, status)


class ApiError(Exception):
    """An error answered as JSON (the message is not put in the HTTP status line)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers: dict[str, str] = {}
