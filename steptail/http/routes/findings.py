"""/api/runs/<run>/findings: the run's findings; `?superseded=1` adds the verdicts replaced."""

from __future__ import annotations

from aiohttp import web

from steptail.http.answers import ApiError, hashed
from steptail.http.requests import possible_run, run_answer
from steptail.storage.reads import run_exists_on


def _tagged_findings(conn, run: str, if_none_match: str | None,
                     superseded: bool = False) -> tuple[str, bytes | None] | None:
    """On the lane's connection: a pool checkout costs more than these two small queries."""
    from steptail.storage.findings import load_findings  # loads the detectors: on first use

    if not run_exists_on(conn, run):
        return None
    data = {"run": run, "findings": [f.to_event() for f in load_findings(conn, run)]}
    if superseded:  # the verdicts newer evaluations replaced, and the gate's reference CE
        from steptail.storage.superseded import verdict_history

        data |= verdict_history(conn, run)
    return hashed(data, if_none_match)


async def findings(request: web.Request) -> web.Response:
    run = possible_run(request)
    flag = request.query.get("superseded", "0")
    if flag not in ("0", "1"):
        raise ApiError(400, "superseded must be 0 or 1")
    return await run_answer(request, run, _tagged_findings, run, request.headers.get("If-None-Match"), flag == "1")
