"""/api/compare (storage/page_compare.py) on SQLite and PostgreSQL: the page's arm-vs-control Δ
in buckets, the first step beyond the tolerance (as `steptail compare`), the config diff
(arm vs control, incarnation vs incarnation), a zoomed range (`from`, `to`), refusals and bad
parameters; /api/runs/<run>/config, each incarnation's Config params."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from store_fixtures import ingest_sample
from test_serve import running

from steptail.storage.compare import compare_runs


@pytest.fixture
def pair(store, samples):
    """`arm` and `ctl`: clean-300 twice; the arm's CE moved by 0.01 from step 200 on and one
    of its config values changed. `rg` (resume-gap) and `rz` (resume-from-zero) as they are."""
    for run, name in (("arm", "clean-300"), ("ctl", "clean-300"), ("rg", "resume-gap"), ("rz", "resume-from-zero")):
        ingest_sample(store, samples, run, name)
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE loss_parts SET ce = ce + 0.01 WHERE run = 'arm' AND step >= 200"))
        conn.execute(sa.text("UPDATE config SET value = 'other' WHERE run = 'arm' AND name = 'run_name'"))
        conn.execute(sa.text("UPDATE runs SET updated_ns = updated_ns + 1 WHERE run = 'arm'"))
    return store


async def _get(http, query: str, **headers):
    async with http.get(f"/api/compare?{query}", headers=headers) as resp:
        return resp.status, resp.headers, json.loads(await resp.read() or b"null")


async def test_delta_first_divergent_step_and_config_diff(pair):
    cli = compare_runs(pair, "arm", "ctl", 1e-3, 0.0)
    async with running(pair) as http:
        status, headers, body = await _get(http, "arm=arm&control=ctl&buckets=30")
        assert status == 200 and body["refused"] is None
        assert body["summary"] == json.loads(json.dumps(cli.summary()))  # the CLI's own numbers
        assert body["summary"]["first_divergent_step"] == 200
        rows = [dict(zip(body["columns"], r, strict=True)) for r in body["delta"]]
        assert len(rows) <= 30 and sum(r["beyond"] for r in rows) == body["summary"]["divergent_steps"]
        first = next(r for r in rows if r["beyond"])
        assert first["s0"] <= 200 <= first["s1"]
        assert max(r["d_max"] for r in rows) == pytest.approx(0.01) and min(r["d_min"] for r in rows) == 0
        assert body["config"]["arm_vs_control"] == [["run_name", "other", "olmo3-7b-sft"]]
        tag = headers["ETag"]
        assert (await _get(http, "arm=arm&control=ctl&buckets=30", **{"If-None-Match": tag}))[0] == 304
        # a run's incarnations against each other: resume-gap's two print the same config
        _, _, body = await _get(http, "arm=rg&control=rz")
        diffs = {(d["run"], d["from"], d["to"]) for d in body["config"]["incarnations"]}
        assert ("rg", 1, 2) in diffs and ("rz", 1, 2) in diffs
        with pair.engine.begin() as conn:
            conn.execute(sa.text("UPDATE config SET value = '7' WHERE run = 'rg' AND incarnation = 2"
                                 " AND name = (SELECT MIN(name) FROM config WHERE run = 'rg')"))
            conn.execute(sa.text("UPDATE runs SET updated_ns = updated_ns + 1 WHERE run = 'rg'"))
            name = conn.execute(sa.text("SELECT MIN(name) FROM config WHERE run = 'rg'")).scalar()
        _, _, body = await _get(http, "arm=rg&control=rz")
        rg = next(d for d in body["config"]["incarnations"] if d["run"] == "rg")
        assert [p[0] for p in rg["params"]] == [name] and rg["params"][0][2] == "7"


async def test_a_zoomed_range_cuts_the_delta_not_the_summary(pair):
    cli = compare_runs(pair, "arm", "ctl", 1e-3, 0.0)
    want = [(r["step"], r["delta"]) for r in cli.rows if 190 <= r["step"] <= 210]
    async with running(pair) as http:
        status, headers, body = await _get(http, "arm=arm&control=ctl&buckets=100&from=190&to=210")
        assert status == 200 and body["summary"] == json.loads(json.dumps(cli.summary()))  # still the whole runs'
        rows = [dict(zip(body["columns"], r, strict=True)) for r in body["delta"]]
        assert body["width"] == 1 and [(r["s0"], r["d_last"]) for r in rows] == [
            (s, pytest.approx(d)) for s, d in want]
        _, whole_headers, _ = await _get(http, "arm=arm&control=ctl&buckets=100")
        assert whole_headers["ETag"] != headers["ETag"]
        _, _, body = await _get(http, "arm=arm&control=ctl&from=5000&to=6000")  # no common step there
        assert body["delta"] == [] and body["summary"]["steps_compared"] == 300
        status, _, _ = await _get(http, "arm=arm&control=ctl&from=9&to=8")
        assert status == 400


async def test_config_of_each_incarnation(pair):
    with pair.engine.begin() as conn:
        stored = conn.execute(sa.text("SELECT incarnation, name, value FROM config WHERE run = 'rg'")).all()
    async with running(pair) as http:
        async with http.get("/api/runs/rg/config") as resp:
            assert resp.status == 200
            tag, body = resp.headers["ETag"], await resp.json()
        got = {(i["incarnation"], n, v) for i in body["incarnations"] for n, v in i["params"].items()}
        assert got == set(stored) and [i["incarnation"] for i in body["incarnations"]] == [1, 2]
        async with http.get("/api/runs/rg/config", headers={"If-None-Match": tag}) as resp:
            assert resp.status == 304
        async with http.get("/api/runs/nope/config") as resp:
            assert resp.status == 404


async def test_refused_and_bad_parameters(pair):
    async with running(pair) as http:
        with pair.engine.begin() as conn:  # another slice shape: `compare` refuses the pair
            conn.execute(sa.text("UPDATE incarnations SET process_count = 8 WHERE run = 'ctl'"))
            conn.execute(sa.text("UPDATE runs SET updated_ns = updated_ns + 1 WHERE run = 'ctl'"))
        status, _, body = await _get(http, "arm=arm&control=ctl")
        assert status == 200 and "slice shapes differ" in body["refused"]
        assert body["config"]["arm_vs_control"]  # the config diff all the same
        for query in ("arm=arm", "control=ctl", "arm=arm&control=arm", "arm=arm&control=ctl&tolerance=x",
                      "arm=arm&control=ctl&tolerance=-1", "arm=arm&control=ctl&rel=nan",
                      "arm=arm&control=ctl&buckets=0", "arm=arm&control=ctl&buckets=9999"):
            status, _, body = await _get(http, query)
            assert status == 400 and body["status"] == 400 and body["error"], query
        status, _, body = await _get(http, "arm=arm&control=nope")
        assert status == 404 and "no run 'nope'" in body["error"]
