"""What a request's path and query may hold: integers in range, a run name some run can have,
a UTF-8 path. Each refusal is a JSON 400/404 (ApiError) before the store is asked anything."""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_to_bytes

from aiohttp import web

from steptail.http.answers import ApiError, tagged
from steptail.http.keys import CONNECTIONS, READS, STORE
from steptail.runs.names import escaped
from steptail.storage.reads import run_exists

INT32_MAX = 2**31 - 1  # steps and incarnations are 32-bit in the store
RUN_MAX = 128  # runs.run is VARCHAR(128): no longer name is a run
INTEGER = re.compile(r"-?[0-9]{1,19}\Z")  # ASCII digits only: int() also takes '²', '1_0', ' 1'
log = logging.getLogger("steptail.serve")  # the server's one logger, whichever module logs


def refuse(request: web.Request, status: int, message: str, why: str) -> ApiError:
    """A request refused for what its path holds: one log line (path escaped), the JSON error."""
    log.warning("%s %s refused (%d): %s", request.method, escaped(request.raw_path), status, why)
    return ApiError(status, message)


def check_path(request: web.Request) -> None:
    """A percent-escape that is not UTF-8 (`%FF`, `%C0%AF`) is a 400: no route or run has it."""
    try:
        unquote_to_bytes(request.raw_path.partition("?")[0]).decode("utf-8")
    except UnicodeDecodeError:
        raise refuse(request, 400, "the request path is not UTF-8", "percent-escapes not UTF-8") from None


def impossible_run(run: str) -> str | None:
    """Why no run can have this name (without asking the store), else None. PostgreSQL cannot
    even compare a NUL (once a 500), and a control character is no name the CLI or a JobSet
    gives; runs.run holds RUN_MAX characters."""
    if any(c < " " or "\x7f" <= c <= "\x9f" for c in run):
        return "run name holds control characters"
    if len(run) > RUN_MAX:
        return f"run name of {len(run)} characters (at most {RUN_MAX})"
    return None



def possible_run(request: web.Request) -> str:
    """The run of the path, or a 404 for a name no run can have (without asking the store)."""
    run = request.match_info["run"]
    why = impossible_run(run)
    if why is not None:
        raise refuse(request, 404, f"no run {run!r}", why)
    return run


async def run_answer(request: web.Request, run: str, read, *args) -> web.Response:
    """The answer `read(conn, *args)` gives about `run` on a pooled connection, tagged (an ETag,
    or 304 for If-None-Match); a read that finds no such run gives None: 404."""
    answer = await request.app[READS].run(request.app[CONNECTIONS].call, read, *args)
    if answer is None:
        raise ApiError(404, f"no run {run!r}")
    return tagged(*answer)


async def known_run(request: web.Request) -> str:
    run = possible_run(request)
    if not await request.app[READS].run(run_exists, request.app[STORE], run):
        raise ApiError(404, f"no run {run!r}")
    return run


def integer(name: str, raw: str, lo: int, hi: int) -> int:
    if not INTEGER.match(raw):
        raise ApiError(400, f"{name} must be an integer")
    value = int(raw)
    if not lo <= value <= hi:
        raise ApiError(400, f"{name} must be between {lo} and {hi}")
    return value


def int_param(request: web.Request, name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    return integer(name, raw, lo, hi)
