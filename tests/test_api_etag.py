"""ETags of the API over real HTTP, on SQLite and PostgreSQL: a run's /steps tag is its state
(runs.updated_ns, its cursors' last commit, its last keys) and the query string; If-None-Match
with it is a 304 without a body; anything committed to the run makes a new tag."""

from __future__ import annotations

import json
import re
import time

import pytest
import sqlalchemy as sa
from store_fixtures import ingest_sample
from test_serve import running

STEPS = "/api/runs/rg/steps?limit=100"


@pytest.fixture
def loaded(store, samples):
    for run, name in (("rg", "resume-gap"), ("nan", "cp4-lb-nan")):
        ingest_sample(store, samples, run, name)
    return store


async def _get(http, path, tag=None):
    headers = {"If-None-Match": tag} if tag else {}
    async with http.get(path, headers=headers) as resp:
        return resp.status, resp.headers, await resp.read()


async def test_same_tag_twice_and_304_without_a_body(loaded):
    async with running(loaded) as http:
        status, headers, body = await _get(http, STEPS)
        tag = headers["ETag"]
        assert status == 200 and tag.startswith('"') and headers["Cache-Control"] == "no-cache"
        again = await _get(http, STEPS)
        assert again[1]["ETag"] == tag and again[2] == body
        for given in (tag, f"W/{tag}", f'"other", {tag}', "*"):
            status, headers, body304 = await _get(http, STEPS, given)
            assert status == 304 and body304 == b"", given
            assert headers["ETag"] == tag and headers["Cache-Control"] == "no-cache"
        assert (await _get(http, STEPS, '"other"'))[0] == 200


async def test_the_tag_differs_per_query_and_run(loaded):
    async with running(loaded) as http:
        tags = {(await _get(http, path))[1]["ETag"] for path in (
            STEPS, "/api/runs/rg/steps?limit=101", "/api/runs/rg/steps", "/api/runs/rg/steps?from=5",
            "/api/runs/nan/steps?limit=100")}
        assert len(tags) == 5


def _add_step(store, step: int) -> None:
    ce = 2.5
    with store.engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO loss_parts (run, incarnation, step, ts_ns, ce, ce_raw, parts)"
                             " VALUES ('rg', 2, :s, :ts, :ce, '2.5', '{}')"),
                     {"s": step, "ts": time.time_ns(), "ce": ce})


async def test_a_new_step_or_a_commit_of_the_run_makes_a_new_tag(loaded, samples):
    async with running(loaded) as http:
        _, headers, _ = await _get(http, STEPS)
        tag = headers["ETag"]
        other = (await _get(http, "/api/runs/nan/steps?limit=100"))[1]["ETag"]
        _add_step(loaded, 10_000)  # a row past the last one
        status, headers, _ = await _get(http, STEPS, tag)
        assert status == 200 and headers["ETag"] != tag
        tag = headers["ETag"]
        # follow's later commits touch the cursors of the streams they read, not runs.updated_ns
        with loaded.engine.begin() as conn:
            conn.execute(sa.text("UPDATE cursors SET updated_ns = updated_ns + 1 WHERE run = 'rg'"))
        status, headers, _ = await _get(http, STEPS, tag)
        assert status == 200 and headers["ETag"] != tag
        tag = headers["ETag"]
        ingest_sample(loaded, samples, "rg", "resume-gap")  # an ingest touches the run
        status, headers, _ = await _get(http, STEPS, tag)
        assert status == 200 and headers["ETag"] != tag
        assert (await _get(http, "/api/runs/nan/steps?limit=100", other))[0] == 304  # other runs keep theirs


async def test_unknown_run_bad_parameters_and_token_come_before_the_tag(loaded):
    async with running(loaded, token="t0k") as http:
        status, _, _ = await _get(http, STEPS, "*")
        assert status == 401
    async with running(loaded) as http:
        assert (await _get(http, "/api/runs/nope/steps", "*"))[0] == 404
        assert (await _get(http, "/api/runs/rg/steps?limit=0", "*"))[0] == 400


async def test_findings_and_runs_are_tagged_by_their_content(loaded):
    async with running(loaded) as http:
        tags = {}
        for path in ("/api/runs/rg/findings", "/api/runs"):
            status, headers, body = await _get(http, path)
            tags[path] = headers["ETag"]
            assert status == 200 and headers["Cache-Control"] == "no-cache"
            status, _, body304 = await _get(http, path, tags[path])
            assert status == 304 and body304 == b""
        with loaded.engine.begin() as conn:
            changed = conn.execute(sa.text("UPDATE findings SET detail = detail || '!' WHERE run = 'rg'")).rowcount
        assert changed
        assert (await _get(http, "/api/runs/rg/findings", tags["/api/runs/rg/findings"]))[0] == 200


def _counter(text: str, name: str) -> float:
    (value,) = re.findall(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(value)


async def test_an_unchanged_run_is_answered_from_the_cache_and_a_commit_never_stale(loaded):
    """Bodies are kept by their tag: the same page or outline of an unchanged run is the same
    bytes without reading its rows again; after a commit (no If-None-Match) the answer holds it."""
    tail, outline = "/api/runs/rg/steps?from=9000", "/api/runs/rg/outline"
    hit = 'steptail_serve_cached_answers_total{cache="hit"}'
    async with running(loaded) as http:
        before = {p: (await _get(http, p))[2] for p in (tail, outline)}
        assert json.loads(before[tail])["steps"] == []
        hits = _counter((await _get(http, "/metrics"))[2].decode(), hit)
        assert {p: (await _get(http, p))[2] for p in (tail, outline)} == before
        assert _counter((await _get(http, "/metrics"))[2].decode(), hit) == hits + 2
        _add_step(loaded, 10_000)
        status, _, body = await _get(http, tail)
        assert status == 200 and [s["step"] for s in json.loads(body)["steps"]] == [10_000]
        after = (await _get(http, outline))[2]
        assert after != before[outline] and b'"last_step":9999,"kind":"gap"' in after  # steps up to 10,000 missing
