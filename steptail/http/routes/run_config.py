"""/api/runs/<run>/config: the `Config param` values each incarnation printed, for the page's
incarnation-vs-incarnation diff of a run (the compare view's arm-vs-control diff is in
/api/compare). Small (tens of names per incarnation): the page picks any two and diffs them.
Tagged by the run's state."""

from __future__ import annotations

from aiohttp import web

from steptail.http.answers import dumps, etag, matches
from steptail.http.requests import possible_run, run_answer
from steptail.storage.api_reads import run_state
from steptail.storage.page_compare import configs


async def run_config(request: web.Request) -> web.Response:
    run = possible_run(request)
    return await run_answer(request, run, _config, run, request.headers.get("If-None-Match"))


def _config(conn, run: str, if_none_match: str | None):
    state = run_state(conn, run)
    if state is None:
        return None
    tag = etag("config", run, state)
    if matches(if_none_match, tag):
        return tag, None
    by_inc = configs(conn, run)
    return tag, dumps({"run": run, "incarnations": [{"incarnation": inc, "params": params}
                                                    for inc, params in sorted(by_inc.items())]}).encode()
