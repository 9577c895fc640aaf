"""`steptail serve` over real sockets, on SQLite and PostgreSQL: every endpoint, token on and
off, pagination, 404s; and the command itself as a process."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import zipfile
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families
from store_fixtures import ingest_sample

from steptail.http.server import serve
from steptail.storage.reads import iter_steps

TOKEN = "serve-token-4242"
STEPTAIL = str(Path(sys.executable).parent / "steptail")
TIMEOUT = aiohttp.ClientTimeout(total=60)


@pytest.fixture
def loaded(store, samples):
    for run, name in (("rg", "resume-gap"), ("nan", "cp4-lb-nan")):
        ingest_sample(store, samples, run, name)
    with store.engine.begin() as conn:
        # ingest stored the samples' own findings; the API is checked on a known set
        conn.execute(sa.text("DELETE FROM findings"))
        conn.execute(sa.text(
            "INSERT INTO findings (run, kind, incarnation, first_step, last_step, detail, severity,"
            " detected_ns) VALUES ('rg', 'gap', 1, 60, 63, 'steps 60-63 missing', 'warning', 1),"
            " ('nan', 'nonfinite_ce', 1, 77, 77, 'ce=nan', 'critical', 2)"))
    return store


@asynccontextmanager
async def running(store, token=None):
    urls: list[str] = []
    stop = asyncio.Event()
    task = asyncio.create_task(serve(store, "127.0.0.1", 0, token, started=urls.append, stop=stop))
    for _ in range(500):
        if urls or task.done():
            break
        await asyncio.sleep(0.01)
    assert urls, "server did not start"
    try:
        async with aiohttp.ClientSession(urls[0], timeout=TIMEOUT) as http:
            yield http
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def _get(http, path, token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.get(path, headers=headers) as resp:
        body = await resp.read()
        return resp.status, resp.headers, body


async def test_healthz_runs_and_metrics(loaded):
    async with running(loaded) as http:
        status, _, body = await _get(http, "/healthz")
        assert status == 200 and json.loads(body) == {"status": "ok"}
        status, _, body = await _get(http, "/api/runs")
        runs = {r["run"]: r for r in json.loads(body)["runs"]}
        assert status == 200 and set(runs) == {"rg", "nan"}
        assert runs["rg"]["last_step"] == 400 and runs["rg"]["incarnations"] == 2
        status, headers, body = await _get(http, "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
        samples = {(s.name, s.labels.get("run")): s.value
                   for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}
        assert samples[("steptail_runs", None)] == 2
        assert samples[("steptail_recent_runs", None)] == 2
        assert samples[("steptail_last_step", "rg")] == 400
        assert samples[("steptail_stored_steps", "rg")] == 426
        assert samples[("steptail_stored_findings", "nan")] == 1
        with loaded.engine.connect() as conn:
            last = conn.execute(sa.text("SELECT MAX(ts_ns) FROM loss_parts WHERE run = 'rg'")).scalar()
        assert samples[("steptail_last_step_timestamp_seconds", "rg")] == pytest.approx(last / 1e9)
        assert ("steptail_last_step_timestamp_seconds", "nan") not in samples  # no timestamps


async def test_steps_pages_equal_steps_json(loaded):
    want = list(iter_steps(loaded, "rg"))
    async with running(loaded) as http:
        got, path, pages = [], "/api/runs/rg/steps?limit=100", 0
        while path:
            status, _, body = await _get(http, path)
            assert status == 200
            page = json.loads(body)
            assert page["count"] == len(page["steps"]) <= 100
            got += page["steps"]
            path, pages = page["next"], pages + 1
        assert pages == 5 and got == json.loads(json.dumps(want))
        # the CLI's `steps --json` prints the same fields
        url = loaded.engine.url.render_as_string(hide_password=False)
        cli = subprocess.run([STEPTAIL, "steps", "rg", "--db", url, "--json", "--from", "150", "--to", "160"],
                             capture_output=True, text=True, timeout=120)
        status, _, body = await _get(http, "/api/runs/rg/steps?from=150&to=160")
        page = json.loads(body)
        assert page["steps"] == json.loads(cli.stdout) and page["next"] is None
        assert [s["step"] for s in page["steps"]] == list(range(150, 161)) + list(range(151, 161))
        status, _, body = await _get(http, "/api/runs/nan/steps?from=77&to=77")
        assert json.loads(body)["steps"][0]["ce"] is None  # nan is null in strict JSON


@pytest.mark.parametrize("query,message", [
    ("limit=0", "limit must be between"), ("limit=100001", "limit must be between"),
    ("from=abc", "from must be an integer"), ("offset=-1", "offset must be between"),
    ("after=2", "after must be INCARNATION:STEP"), ("after=a:1", "after must be INCARNATION:STEP"),
])
async def test_bad_parameters_are_400_json(loaded, query, message):
    async with running(loaded) as http:
        status, headers, body = await _get(http, f"/api/runs/rg/steps?{query}")
        assert status == 400 and headers["Content-Type"].startswith("application/json")
        assert message in json.loads(body)["error"]


async def test_unknown_run_and_route_are_404_json(loaded):
    async with running(loaded) as http:
        for path in ("/api/runs/nope/steps", "/api/runs/nope/findings", "/api/runs/nope/export",
                     "/api/runs/%0d%0aX/steps", "/no/such/route"):
            status, headers, body = await _get(http, path)
            assert status == 404 and headers["Content-Type"].startswith("application/json"), path
            assert json.loads(body)["status"] == 404
        assert "no run 'nope'" in json.loads((await _get(http, "/api/runs/nope/steps"))[2])["error"]
        async with http.post("/api/runs") as resp:  # read-only
            assert resp.status == 405


async def test_findings(loaded):
    async with running(loaded) as http:
        status, _, body = await _get(http, "/api/runs/rg/findings")
        data = json.loads(body)
        assert status == 200 and data["run"] == "rg"
        assert [(f["kind"], f["first_step"], f["last_step"], f["severity"]) for f in data["findings"]] == [
            ("gap", 60, 63, "warning")]


async def test_export_bundle(loaded):
    async with running(loaded) as http:
        status, headers, body = await _get(http, "/api/runs/rg/export")
        assert status == 200 and headers["Content-Type"] == "application/zip"
        with zipfile.ZipFile(io.BytesIO(body)) as zf:
            names = set(zf.namelist())
            manifest = json.loads(zf.read("rg/manifest.json"))
        assert {"rg/manifest.json", "rg/ce.png", "rg/loss_parts.parquet"} <= names
        assert manifest["run"] == "rg" and manifest["counts"]["loss_parts"] == 426


async def test_token_required_when_configured(loaded):
    async with running(loaded, token=TOKEN) as http:
        assert (await _get(http, "/healthz"))[0] == 200  # liveness probes need no token
        for path in ("/metrics", "/api/runs", "/api/runs/rg/steps", "/api/runs/rg/findings",
                     "/api/runs/rg/export", "/api/runs/nope/steps"):
            status, headers, body = await _get(http, path)
            assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer"), path
            assert (await _get(http, path, token="wrong"))[0] == 401
        assert (await _get(http, "/api/runs", token=TOKEN))[0] == 200
        assert (await _get(http, "/metrics", token=TOKEN))[0] == 200
        assert (await _get(http, "/api/runs/nope/steps", token=TOKEN))[0] == 404


async def test_cli_process_binds_localhost_and_stops_on_sigterm(loaded, tmp_path):
    url = loaded.engine.url.render_as_string(hide_password=False)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    proc = await asyncio.create_subprocess_exec(
        STEPTAIL, "serve", "--port", "0", "--token-file", str(token_file), "--db", url,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "STEPTAIL_DB": ""})
    try:
        line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
        assert "http://127.0.0.1:" in line and TOKEN not in line
        base = line.split(" on ")[1].split(" ")[0]
        async with aiohttp.ClientSession(base, timeout=TIMEOUT) as http:
            assert (await _get(http, "/api/runs"))[0] == 401
            status, _, body = await _get(http, "/api/runs", token=TOKEN)
            assert status == 200 and len(json.loads(body)["runs"]) == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        rest = await asyncio.wait_for(proc.stderr.read(), 30)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    assert TOKEN.encode() not in rest


def test_cli_bad_token_file_is_exit_2(tmp_path):
    res = subprocess.run([STEPTAIL, "serve", "--token-file", str(tmp_path / "missing"),
                          "--db", str(tmp_path / "x.db")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "cannot read token file" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_non_finite_numbers_become_null():
    from steptail.http.answers import json_response as _json

    body = json.loads(_json({"a": [float("nan"), 1.5, {"b": float("inf")}]}).text)
    assert body == {"a": [None, 1.5, {"b": None}]}
