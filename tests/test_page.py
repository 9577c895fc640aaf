"""The web page of `steptail serve` (`/`, steptail/web, docs/page.md), on SQLite and PostgreSQL.

Over HTTP: the page and its files (plotly.min.js from the installed plotly package) need no
token and are tagged; the page's JSON (/api/overview, /api/runs/{run}/outline) does. In real
headless Chromium (driven over the DevTools protocol): `steptail serve` as a process over a
store filled with `steptail ingest` from tests/samples; the runs table; a run's gap, NaN,
restore point, findings and REQUIRED_RBF coverage, read from the page's state
(window.steptailState), its DOM and plotly's figure, and a screenshot whose pixels are checked
where the gap is shaded; steps ingested while the page is open appear without a reload, read
incrementally; a control run overlaid; names and details from the store stay text.

The browser tests skip only when /usr/bin/chromium is absent (CI installs it)."""

from __future__ import annotations

import asyncio
import base64
import io
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import aiohttp
import pytest
import sqlalchemy as sa
from store_fixtures import PG_ADMIN, ingest_sample, samples_dir
from test_serve import running

from steptail.http.server import serve
from steptail.storage.db import open_store
from steptail.storage.scratch import scratch_database

CHROMIUM = "/usr/bin/chromium"
STEPTAIL = str(Path(sys.executable).parent / "steptail")
TOKEN = "page-token-4242"
WIDTH, HEIGHT = 1280, 900
HOSTILE = 'x<img src=x onerror="window.pwned=1">&amp;\'"'  # a name another writer stored
HOSTILE_DETAIL = '<img src=x onerror="window.pwned=2"><b>bold</b> &lt;not markup&gt;'
needs_chromium = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK),
    reason=f"headless Chromium ({CHROMIUM}) is not installed: apt-get install chromium")


# -- stores -------------------------------------------------------------------------------------
def _ingest(url: str, run: str, path: Path) -> None:
    res = subprocess.run([STEPTAIL, "ingest", "--db", url, "--run", run, str(path)],
                         capture_output=True, text=True, timeout=180, env={**os.environ, "STEPTAIL_DB": ""})
    assert res.returncode == 0, res.stderr


def _split(log: Path, step: int, folder: Path) -> tuple[Path, Path]:
    """The log cut before the LOSS-PARTS line of `step`: two files, ingested one after the other."""
    lines = log.read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if f"LOSS-PARTS step={step} " in line)
    first, second = folder / f"{log.stem}.1.log", folder / f"{log.stem}.2.log"
    first.write_text("".join(lines[:cut]))
    second.write_text("".join(lines[cut:]))
    return first, second


COPIED = ("runs", "run_sources", "incarnations", "loss_parts", "required_rbf", "loss_summary", "checkpoints", "config")


def _hostile(url: str) -> None:
    """The run `clean` again under a name holding markup, with a finding whose detail holds
    markup too: written by SQL, as another writer of a shared store could (the CLI and the
    collector refuse such a name)."""
    store = open_store(url)
    try:
        with store.engine.begin() as conn:
            for table in COPIED:
                cols = [c["name"] for c in sa.inspect(conn).get_columns(table) if c["name"] != "run"]
                listed = ", ".join(cols)
                conn.execute(sa.text(f"INSERT INTO {table} (run, {listed}) SELECT :name, {listed} FROM {table}"
                                     " WHERE run = 'clean'"), {"name": HOSTILE})
            conn.execute(sa.text(
                "INSERT INTO findings (run, kind, incarnation, first_step, last_step, detail, severity, detected_ns)"
                " VALUES (:run, 'gap', 1, 10, 12, :detail, 'warning', 1)"), {"run": HOSTILE, "detail": HOSTILE_DETAIL})
    finally:
        store.dispose()


@contextmanager
def _database(kind: str, folder: Path):
    if kind == "sqlite":
        yield f"sqlite:///{folder / 'steptail.db'}"
        return
    with scratch_database(PG_ADMIN, "steptail_test") as url:
        yield url


class Served:
    def __init__(self, url: str, base: str, live_rest: Path) -> None:
        self.url, self.base, self.live_rest = url, base, live_rest


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request, tmp_path_factory):
    """`steptail serve` (a process) over a store of the samples: rg (resume-gap), nan
    (cp4-lb-nan), clean (clean-300), live (clean-300's first 150 steps; `live_rest` holds the
    others) and the HOSTILE run."""
    folder = tmp_path_factory.mktemp(f"page-{request.param}")
    samples = samples_dir()
    with _database(request.param, folder) as url:
        for run, name in (("rg", "resume-gap"), ("nan", "cp4-lb-nan"), ("clean", "clean-300")):
            _ingest(url, run, samples / f"{name}.log")
        first, rest = _split(samples / "clean-300.log", 151, folder)
        _ingest(url, "live", first)
        _hostile(url)
        err = folder / "serve.err"
        with err.open("wb") as err_file:
            proc = subprocess.Popen([STEPTAIL, "serve", "--port", "0", "--db", url], stderr=err_file,
                                    stdout=subprocess.DEVNULL, env={**os.environ, "STEPTAIL_DB": ""})
        try:
            base = None
            for _ in range(600):
                text = err.read_text()
                if " on http://" in text:
                    base = text.split(" on ")[1].split(" ")[0]
                    break
                assert proc.poll() is None, text
                time.sleep(0.1)
            assert base, "steptail serve did not start"
            yield Served(url, base, rest)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log = err.read_text()
        assert "Traceback" not in log and " ERROR " not in log, log[-3000:]


# -- the browser: headless Chromium over the DevTools protocol -------------------------------------
@pytest.fixture(scope="module")
def chromium():
    """A headless Chromium for the module; yields its DevTools port."""
    profile = tempfile.mkdtemp(prefix="steptail-chromium-")
    proc = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--mute-audio", "--hide-scrollbars",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", f"--user-data-dir={profile}",
         f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        active = Path(profile) / "DevToolsActivePort"
        for _ in range(600):
            if active.exists() and len(active.read_text().splitlines()) >= 2:
                break
            assert proc.poll() is None, "chromium exited"
            time.sleep(0.1)
        yield int(active.read_text().split()[0])
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, True)


class Page:
    """One browser tab: send DevTools commands, evaluate JavaScript, keep the page's errors."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.errors: list[str] = []  # uncaught exceptions, console errors, failed loads, CSP reports

    async def send(self, method: str, **params):
        i = next(self.ids)
        await self.ws.send_str(json.dumps({"id": i, "method": method, "params": params}))
        while True:
            msg = await asyncio.wait_for(self.ws.receive(), 60)
            assert msg.type == aiohttp.WSMsgType.TEXT, msg
            data = json.loads(msg.data)
            if data.get("id") == i:
                if "error" in data:
                    raise RuntimeError(f"{method}: {data['error']}")
                return data["result"]
            self._event(data)

    def _event(self, data: dict) -> None:
        method, p = data.get("method"), data.get("params", {})
        if method == "Runtime.exceptionThrown":
            self.errors.append(json.dumps(p["exceptionDetails"])[:500])
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            self.errors.append(json.dumps(p.get("args"))[:500])
        elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
            self.errors.append(f"{p['entry'].get('text')} {p['entry'].get('url', '')}")

    async def eval(self, expression: str):
        r = await self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in r:
            raise AssertionError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    async def goto(self, url: str) -> None:
        """Navigate, and wait for the page's script to start."""
        await self.send("Page.navigate", url=url)
        await self.until(f"location.href === {json.dumps(url)} && window.steptailState !== undefined")

    async def until(self, expression: str, timeout: float = 60.0):
        """The value of `expression` once truthy (polled)."""
        deadline = time.monotonic() + timeout
        while True:
            value = await self.eval(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                state = await self.eval("JSON.stringify(window.steptailState || null)")
                raise AssertionError(f"timed out waiting for {expression}; state {state}; errors {self.errors}")
            await asyncio.sleep(0.1)

    async def ready(self) -> dict:
        await self.until("window.steptailState && window.steptailState.ready")
        return await self.state()

    async def state(self) -> dict:
        return json.loads(await self.eval("JSON.stringify(window.steptailState)"))

    async def screenshot(self, path: Path) -> bytes:
        png = base64.b64decode((await self.send("Page.captureScreenshot", format="png"))["data"])
        path.write_bytes(png)
        return png


@asynccontextmanager
async def tab(port: int):
    async with aiohttp.ClientSession() as http:
        async with http.put(f"http://127.0.0.1:{port}/json/new?about:blank") as resp:
            target = await resp.json()
        try:
            async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                for domain in ("Page", "Runtime", "Log"):
                    await page.send(f"{domain}.enable")
                await page.send("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT,
                                deviceScaleFactor=1, mobile=False)
                yield page
        finally:
            async with http.get(f"http://127.0.0.1:{port}/json/close/{target['id']}") as resp:
                await resp.read()


def _pixels(png: bytes):
    from PIL import Image  # matplotlib's dependency

    image = Image.open(io.BytesIO(png)).convert("RGB")
    return image


def _reddish(rgb: tuple[int, int, int]) -> bool:
    r, g, b = rgb
    return r > g + 12 and r > b + 12


# -- HTTP: the page's files and JSON ------------------------------------------------------------------
@pytest.fixture
def loaded(store, samples):
    for run, name in (("rg", "resume-gap"), ("nan", "cp4-lb-nan")):
        ingest_sample(store, samples, run, name)
    return store


async def _get(http, path, **headers):
    async with http.get(path, headers=headers) as resp:
        return resp.status, resp.headers, await resp.read()


async def test_page_files_need_no_token_and_are_tagged(loaded):
    async with running(loaded, token=TOKEN) as http:
        status, headers, body = await _get(http, "/")
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        assert "script-src 'self'" in headers["Content-Security-Policy"]
        assert b'src="static/page.js"' in body
        for name, kind in (("page.js", "text/javascript"), ("page.css", "text/css"),
                           ("plotly.min.js", "text/javascript")):
            status, headers, body = await _get(http, f"/static/{name}", **{"Accept-Encoding": "gzip"})
            assert status == 200 and headers["Content-Type"].startswith(kind), name
            assert headers["Content-Encoding"] == "gzip" and headers["ETag"]  # aiohttp decoded the body
            again = await _get(http, f"/static/{name}", **{"If-None-Match": headers["ETag"]})
            assert again[0] == 304 and again[2] == b""
        status, headers, body = await _get(http, "/static/plotly.min.js", **{"Accept-Encoding": "identity"})
        assert "Content-Encoding" not in headers and b"plotly.js v" in body[:200] and len(body) > 1_000_000
        for path in ("/static/nope.js", "/static/..%2fserve.py", "/static/__init__.py"):
            status, _, body = await _get(http, path)
            assert status == 404 and json.loads(body)["status"] == 404, path
        # the page's data needs the token, as every other API route
        for path in ("/api/overview", "/api/runs/rg/outline", "/static/../api/overview"):
            assert (await _get(http, path))[0] == 401, path
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert (await _get(http, "/api/overview", **auth))[0] == 200
        assert (await _get(http, "/api/runs/rg/outline", **auth))[0] == 200


async def test_overview_and_outline(loaded):
    async with running(loaded) as http:
        status, headers, body = await _get(http, "/api/overview")
        assert status == 200 and headers["Cache-Control"] == "no-cache"
        runs = {r["run"]: r for r in json.loads(body)["runs"]}
        assert set(runs) == {"rg", "nan"}
        rg, nan = runs["rg"], runs["nan"]
        assert (rg["state"], rg["incarnations"], rg["steps"], rg["last_step"], rg["last_incarnation"]) == (
            "ingested", 2, 426, 400, 2)  # from saved files: ingested, however recently written
        assert rg["state_reason"] == "from saved log files: not followed"
        assert rg["last_ce_raw"] == "1.970015" and rg["sources"] == ["files"]
        assert (rg["findings"], rg["critical"], rg["warning"]) == (2, 0, 2)
        assert (nan["findings"], nan["critical"], nan["warning"]) == (3, 2, 1) and nan["last_ts"] is None
        assert (await _get(http, "/api/overview", **{"If-None-Match": headers["ETag"]}))[0] == 304

        status, headers, body = await _get(http, "/api/runs/rg/outline")
        outline = json.loads(body)
        assert status == 200 and outline["run"] == "rg"
        assert [(i["incarnation"], i["lo"], i["hi"], i["steps"], i["rbf_steps"], i["restored_from"])
                for i in outline["incarnations"]] == [(1, 1, 180, 176, 174, None), (2, 151, 400, 250, 250, 150)]
        assert outline["restores"] == [{"incarnation": 2, "restored_from": 150, "first_step": 151, "step": 150}]
        assert outline["gaps"] == [{"incarnation": 1, "first_step": 60, "last_step": 63, "kind": "gap"}]
        assert {"incarnation": 2, "kind": "restore", "step": 150} in [
            {k: c[k] for k in ("incarnation", "kind", "step")} for c in outline["checkpoints"]]
        tag = headers["ETag"]
        assert (await _get(http, "/api/runs/rg/outline", **{"If-None-Match": tag}))[0] == 304
        with loaded.engine.begin() as conn:  # a commit to the run: a new tag
            conn.execute(sa.text("UPDATE runs SET updated_ns = updated_ns + 1 WHERE run = 'rg'"))
        status, headers, _ = await _get(http, "/api/runs/rg/outline", **{"If-None-Match": tag})
        assert status == 200 and headers["ETag"] != tag
        status, _, body = await _get(http, "/api/runs/nope/outline")
        assert status == 404 and "no run 'nope'" in json.loads(body)["error"]


async def test_a_restart_without_restore_and_stalled_state(store, samples):
    ingest_sample(store, samples, "rz", "resume-from-zero")
    with store.engine.begin() as conn:  # followed now (a collector's heartbeat), its last step days old
        conn.execute(sa.text("INSERT INTO run_sources (run, source, added_ns) VALUES ('rz', 'kubernetes:default/rz', 1)"))
        conn.execute(sa.text("UPDATE runs SET followed_ns = :now WHERE run = 'rz'"), {"now": time.time_ns()})
    async with running(store) as http:
        outline = json.loads((await _get(http, "/api/runs/rz/outline"))[2])
        assert outline["restores"] == [{"incarnation": 2, "restored_from": None, "first_step": 1, "step": 0}]
        run = json.loads((await _get(http, "/api/overview"))[2])["runs"][0]
        assert (run["run"], run["state"]) == ("rz", "stalled")


# -- the browser ------------------------------------------------------------------------------------
@needs_chromium
async def test_runs_table(served, chromium):
    async with tab(chromium) as page:
        await page.goto(served.base + "/")
        state = await page.ready()
        assert state["view"] == "runs"
        assert set(state["runs"]) == {"rg", "nan", "clean", "live", HOSTILE}
        rows = await page.eval("""[...document.querySelectorAll('#runs-table tbody tr')].map(tr => ({
            run: tr.dataset.run, severity: tr.dataset.severity, state: tr.dataset.state,
            text: tr.cells[0].textContent, href: tr.querySelector('a').getAttribute('href'),
            last: tr.cells[6].textContent, ce: tr.cells[7].textContent, findings: tr.cells[9].textContent}))""")
        by_run = {r["run"]: r for r in rows}
        assert by_run["rg"]["severity"] == "warning" and by_run["nan"]["severity"] == "critical"
        assert by_run["clean"]["severity"] == "none" and by_run["clean"]["findings"] == "none"
        assert by_run["rg"]["last"] == "400 (#2)" and by_run["rg"]["ce"] == "1.970015"
        assert by_run["nan"]["findings"] == "2 critical1 warning"
        assert by_run["rg"]["href"] == "?run=rg"
        # a name holding markup is text, and its link carries it encoded
        assert by_run[HOSTILE]["text"] == HOSTILE
        assert await page.eval("document.querySelectorAll('img').length") == 0
        assert await page.eval("window.pwned === undefined")
        await page.eval("document.querySelector('#runs-table a[href=\"?run=rg\"]').click()")
        await page.until("location.search === '?run=rg' && window.steptailState"
                         " && window.steptailState.view === 'run' && window.steptailState.ready")
        assert not page.errors, page.errors


@needs_chromium
async def test_run_view_gap_restore_findings_and_screenshot(served, chromium, tmp_path):
    async with tab(chromium) as page:
        await page.goto(served.base + "/?run=rg")
        state = await page.ready()
        assert (state["view"], state["run"], state["steps"], state["incarnations"]) == ("run", "rg", 426, [1, 2])
        assert state["last"] == {"incarnation": 2, "step": 400} and state["lastCe"] == "1.970015"
        # the gap: in the page's state, its table, the chart's shading, and a break in the line
        assert state["gaps"] == [{"incarnation": 1, "first_step": 60, "last_step": 63, "kind": "gap"}]
        assert await page.eval("[...document.querySelectorAll('#gaps-table tr[data-gap]')].map("
                               "tr => [tr.dataset.first, tr.dataset.last])") == [["60", "63"]]
        figure = json.loads(await page.eval("""(() => { const c = document.getElementById('ce-chart');
            return JSON.stringify({data: c.data.map(t => ({name: t.name, x: t.x, y: t.y})),
                                   shapes: c.layout.shapes}); })()"""))
        rects = [(s["x0"], s["x1"]) for s in figure["shapes"] if s["type"] == "rect"]
        assert rects == [(59.5, 63.5)]
        first = next(t for t in figure["data"] if t["name"] == "#1")
        at = first["x"].index(59)
        assert first["x"][at + 2] == 64 and first["y"][at + 1] is None  # the line breaks over the gap
        # the restore point: incarnation 2 resumed from the checkpoint at step 150
        assert state["restores"] == [{"incarnation": 2, "restored_from": 150, "first_step": 151, "step": 150}]
        assert [s["x0"] for s in figure["shapes"] if s["type"] == "line"] == [150.5]
        # findings, in the table and the chart's strip
        assert [(f["kind"], f["first_step"], f["last_step"], f["severity"]) for f in state["findings"]] == [
            ("gap", 60, 63, "warning"), ("missing_rbf", 90, 91, "warning")]
        assert await page.eval("[...document.querySelectorAll('#findings-table tbody tr')].map("
                               "tr => tr.dataset.kind)") == ["gap", "missing_rbf"]
        assert "warning findings" in [t["name"] for t in figure["data"]]
        # REQUIRED_RBF: logged, missing at 90-91 of incarnation 1
        assert state["rbf"]["logged"] and state["rbf"]["rows"] == 424
        assert state["rbf"]["missing"] == [{"incarnation": 1, "first": 90, "last": 91}]
        assert "missing at #1 steps 90–91" in await page.eval("document.getElementById('rbf-summary').textContent")
        # the loss parts: every other LOSS-PARTS key (by name), the first one drawn
        assert state["parts"] == ["moe_lb", "total", "tunix_loss", "weights", "z_loss"]
        assert await page.eval("document.getElementById('parts-chart').data.length") == 2
        assert await page.eval("document.querySelector('#last-parts tr[data-part=\"weights\"] td').textContent") == "1048576"
        assert not page.errors, page.errors

        # the screenshot: the size asked for, not blank, and red where the gap is shaded
        where = await page.eval("""(() => {
            const c = document.getElementById('ce-chart'), box = c.getBoundingClientRect();
            const xa = c._fullLayout.xaxis, ya = c._fullLayout.yaxis;
            const x = (step) => Math.round(box.left + xa._offset + xa.l2p(step));
            return {gap: x(61.5), clear: x(30), low: Math.round(box.top + ya._offset + ya._length * 0.97),
                    mid: Math.round(box.top + ya._offset + ya._length * 0.5)}; })()""")
        png = await page.screenshot(tmp_path / "rg.png")
        image = _pixels(png)
        assert image.size == (WIDTH, HEIGHT)
        assert len(image.getcolors(maxcolors=WIDTH * HEIGHT)) > 50  # not a blank page
        assert _reddish(image.getpixel((where["gap"], where["mid"])))
        assert _reddish(image.getpixel((where["gap"], where["low"])))
        assert not _reddish(image.getpixel((where["clear"], where["low"])))


@needs_chromium
async def test_where_the_time_went(served, chromium):
    """The goodput bar split by cause and the step time of each incarnation (docs/goodput.md)."""
    async with tab(chromium) as page:
        await page.goto(served.base + "/?run=rg")
        await page.ready()
        # goodput reads every step: asked without holding up the first draw, drawn when it comes
        await page.until("window.steptailState.goodput && window.steptailState.goodput.run === 'rg'")
        state = await page.state()
        g = state["goodput"]
        assert g["run"] == "rg" and 0.9 < g["goodput"] < 0.93 and g["replayed_s"] > 300
        parts = await page.eval("[...document.querySelectorAll('#goodput-bar span')].map(s => s.dataset.part)")
        assert parts[:2] == ["productive", "replayed"]
        width = await page.eval("parseFloat(document.querySelector('#goodput-bar .part-productive').style.width)")
        assert abs(width - 100 * g["goodput"]) < 0.01
        rows = await page.eval("[...document.querySelectorAll('#step-time-table tbody tr')].map("
                               "tr => [...tr.cells].map(c => c.textContent))")
        assert [r[0] for r in rows] == ["1", "2"] and all(11.5 < float(r[1]) < 12.5 for r in rows)
        assert f"goodput {100 * g['goodput']:.1f}% of" in await page.eval("document.getElementById('goodput-summary').textContent")
        await page.goto(served.base + "/?run=nan")  # logged without timestamps: no wall time, no bar
        await page.until("window.steptailState.ready && window.steptailState.goodput")
        state = await page.state()
        assert state["goodput"]["wall_s"] is None
        assert await page.eval("document.getElementById('goodput-bar').hidden") is True
        assert not page.errors, page.errors


@needs_chromium
async def test_nan_and_findings_without_a_step(served, chromium):
    async with tab(chromium) as page:
        await page.goto(served.base + "/?run=nan")
        state = await page.ready()
        assert state["nanSteps"] == [{"incarnation": 1, "step": 77, "raw": "nan"}]
        assert state["gaps"] == [] and state["restores"] == []
        marks = await page.eval("document.getElementById('ce-chart').data.filter("
                                "t => t.name === 'non-finite CE').map(t => t.x)")
        assert marks == [[77]]
        assert await page.eval("document.querySelector('#run-facts [data-fact=\"non-finite CE\"] b').textContent") == "1"
        rows = await page.eval("[...document.querySelectorAll('#findings-table tbody tr')].map("
                               "tr => [tr.dataset.kind, tr.dataset.severity, tr.cells[3].textContent])")
        assert rows == [["rule:load_balance", "critical", "—"], ["step1_ce_gate", "warning", "step 1"],
                        ["nonfinite_ce", "critical", "step 77"]]
        assert not page.errors, page.errors


@needs_chromium
async def test_new_steps_appear_without_a_reload(served, chromium):
    async with tab(chromium) as page:
        await page.goto(served.base + "/?run=live&poll=0.5")
        state = await page.ready()
        assert state["steps"] == 150 and state["last"] == {"incarnation": 1, "step": 150}
        await page.eval("window.sameDocument = 42; performance.setResourceTimingBufferSize(100000)")
        polls = state["polls"]
        await page.until(f"window.steptailState.polls >= {polls + 2}")  # nothing new: 304s
        await asyncio.to_thread(_ingest, served.url, "live", served.live_rest)  # the second half
        await page.until("window.steptailState.last.step === 300", timeout=60)
        state = await page.state()
        assert state["steps"] == 300 and state["incarnations"] == [1] and state["gaps"] == []
        assert await page.eval("window.sameDocument") == 42  # the same document: no reload
        assert await page.eval("performance.getEntriesByType('navigation').length") == 1
        x = await page.eval("document.getElementById('ce-chart').data.find(t => t.name === '#1').x")
        assert x == list(range(1, 301))
        assert await page.eval("document.querySelector('#run-facts [data-fact=\"steps\"] b').textContent") == "300"
        # read incrementally: the whole run once, then only the steps after the last one read
        urls = await page.eval("performance.getEntriesByType('resource').map(e => e.name)"
                               ".filter(u => u.includes('/steps?'))")
        assert sum("after=" not in u for u in urls) == 1, urls
        assert any("after=1%3A149&" in u for u in urls), urls
        statuses = await page.eval("performance.getEntriesByType('resource').filter(e => "
                                   "e.name.includes('after=1%3A149&')).map(e => e.responseStatus)")
        assert 304 in statuses and 200 in statuses, statuses  # 304s while nothing was new
        assert not page.errors, page.errors


@needs_chromium
async def test_overlay_of_a_control_run(served, chromium):
    async with tab(chromium) as page:
        await page.goto(served.base + "/?run=nan&vs=clean")
        await page.until("window.steptailState.ready && window.steptailState.overlay"
                         " && window.steptailState.overlay.steps === 300")
        names = await page.eval("document.getElementById('ce-chart').data.map(t => t.name)")
        assert "control: clean" in names
        note = await page.eval("document.getElementById('overlay-note').textContent")
        assert note.startswith("119 common steps")  # 1-120 but the NaN step
        # another control picked in the page
        await page.eval("""(() => { const s = document.getElementById('overlay-select');
            s.value = 'rg'; s.dispatchEvent(new Event('change')); })()""")
        await page.until("window.steptailState.overlay && window.steptailState.overlay.run === 'rg'"
                         " && window.steptailState.overlay.steps === 426")
        assert await page.eval("location.search") == "?run=nan&vs=rg"
        assert "control: rg" in await page.eval("document.getElementById('ce-chart').data.map(t => t.name)")
        assert not page.errors, page.errors
        # a control or a run the store does not hold: said in the page, the rest still drawn
        page.errors.clear()
        await page.goto(served.base + "/?run=nan&vs=nope")
        state = await page.ready()
        assert state["steps"] == 120 and state["overlay"] == {"run": "nope", "steps": 0}
        await page.until("document.getElementById('overlay-note').textContent === \"control: no run 'nope'\"")
        await page.goto(served.base + "/?run=nope")
        await page.until("window.steptailState.missing === true")
        assert await page.eval("document.getElementById('run-facts').textContent") == "No run nope in the store (yet)."
        assert all("404" in e for e in page.errors), page.errors


@needs_chromium
async def test_names_and_details_from_the_store_stay_text(served, chromium):
    async with tab(chromium) as page:
        await page.goto(f"{served.base}/?run={_quote(HOSTILE)}")
        state = await page.ready()
        assert state["run"] == HOSTILE and state["steps"] == 300
        assert await page.eval("document.getElementById('run-name').textContent") == HOSTILE
        assert await page.eval("document.querySelector('#findings-table td.detail').textContent") == HOSTILE_DETAIL
        assert await page.eval("document.querySelectorAll('img').length") == 0
        assert await page.eval("[...document.querySelectorAll('b')].every(b => b.textContent !== 'bold')")
        assert await page.eval("window.pwned === undefined")
        # plotly reads tags in hover text: the page escapes them first
        texts = await page.eval("document.getElementById('ce-chart').data.filter(t => t.name === "
                                "'warning findings').flatMap(t => t.text).filter(Boolean)")
        assert texts and all("&lt;img" in t and "<img" not in t for t in texts)
        assert await page.eval("document.querySelectorAll('#ce-chart b, #ce-chart a').length") == 0
        assert not page.errors, page.errors


@needs_chromium
async def test_the_page_asks_for_the_token_and_sends_it(loaded, chromium):
    urls: list[str] = []
    stop = asyncio.Event()
    server = asyncio.create_task(serve(loaded, "127.0.0.1", 0, TOKEN, started=urls.append, stop=stop))
    try:
        for _ in range(500):
            if urls or server.done():
                break
            await asyncio.sleep(0.01)
        assert urls, "server did not start"
        async with tab(chromium) as page:
            await page.goto(urls[0] + "/")
            await page.until("!document.getElementById('token-form').hidden")
            assert await page.eval("document.getElementById('status').textContent") == "token needed"
            assert not await page.eval("window.steptailState.ready")
            await page.eval(f"""(() => {{ document.getElementById('token-input').value = {json.dumps(TOKEN)};
                document.getElementById('token-form').requestSubmit(); }})()""")
            state = await page.ready()
            assert set(state["runs"]) == {"rg", "nan"}
            assert await page.eval("document.getElementById('token-form').hidden")
            # the run view sends it too (kept for the tab)
            await page.goto(urls[0] + "/?run=rg")
            state = await page.ready()
            assert state["steps"] == 426 and state["gaps"][0]["first_step"] == 60
            # the 401s of the first try are the only errors the browser saw
            assert all("401" in e for e in page.errors), page.errors
    finally:
        stop.set()
        await asyncio.wait_for(server, 30)


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")
