"""The page's views beyond tests/test_page.py's, in real headless Chromium on SQLite and
PostgreSQL (its served store and browser): a long run drawn from /api/runs/<run>/series
(docs/page.md "A long run"), compare (`?runs=&control=`), the reading aids (x by time,
smoothing, log) and the step-time panel.

`&summary=0` draws even a sample run from /series. At a bucket per step it must show what the
whole-steps view shows (gaps, NaN steps, REQUIRED_RBF coverage, step count); with wide buckets
the largest CE stays drawn (the buckets' max); a zoom asks /series again for that range only;
the steps read are the run's tail, without rbf_per_layer."""

from __future__ import annotations

import json
import time

import sqlalchemy as sa
from test_page import chromium, needs_chromium, served, tab  # noqa: F401  (fixtures)

from steptail.storage.db import open_store

SEEN = "JSON.stringify(performance.getEntriesByType('resource').map(e => e.name))"


def _summary_fields(state: dict) -> dict:
    return {"steps": state["steps"], "gaps": state["gaps"], "nan": [n["step"] for n in state["nanSteps"]],
            "rbf": {k: state["rbf"][k] for k in ("logged", "covered", "missing")}}


@needs_chromium
async def test_a_bucket_per_step_shows_what_whole_steps_show(served, chromium):  # noqa: F811
    async with tab(chromium) as page:
        for run in ("rg", "nan"):
            await page.goto(f"{served.base}/?run={run}")
            whole = await page.ready()
            assert whole["summary"] is None
            await page.goto(f"{served.base}/?run={run}&summary=0")
            summary = await page.ready()
            assert summary["summary"]["width"] == 1 and summary["summary"]["drawn"] == whole["steps"]
            assert _summary_fields(summary) == _summary_fields(whole), run
            assert summary["restores"] == whole["restores"]
            seen = json.loads(await page.eval(SEEN))
            assert any("/series?buckets=" in u for u in seen)
            steps = [u for u in seen if "/steps?" in u]
            assert steps and all("fields=" in u and "rbf_per_layer" not in u for u in steps), steps
        assert not page.errors, page.errors


@needs_chromium
async def test_wide_buckets_keep_the_extremes_and_a_zoom_asks_again(served, chromium):  # noqa: F811
    store = open_store(served.url)
    try:
        with store.engine.connect() as conn:
            top, bottom = conn.execute(sa.text("SELECT MAX(ce), MIN(ce) FROM loss_parts WHERE run = 'rg'")).one()
    finally:
        store.dispose()
    async with tab(chromium) as page:
        await page.goto(f"{served.base}/?run=rg&summary=0&buckets=10")
        state = await page.ready()
        assert state["summary"]["width"] == 48 and state["summary"]["drawn"] <= 20  # blocks of 16; 2 incarnations
        ys = await page.eval("""JSON.stringify(document.getElementById('ce-chart').data
            .filter(t => t.name.startsWith('#')).flatMap(t => t.y).filter(v => typeof v === 'number'))""")
        ys = json.loads(ys)
        assert max(ys) == top and min(ys) == bottom  # a spike or a dip is never averaged away
        # the last steps are read whole: the facts and loss parts
        assert state["last"] == {"incarnation": 2, "step": 400} and state["lastCe"] == "1.970015"
        await page.eval("Plotly.relayout(document.getElementById('ce-chart'), {'xaxis.range': [100.4, 139.6]}).then(() => true)")
        await page.until("window.steptailState.zooms >= 1 && window.steptailState.renders > 0")
        state = await page.ready()
        await page.until("JSON.stringify(window.steptailState.summary.zoom) === '[100,140]'")
        state = await page.state()
        assert state["summary"]["width"] == 5  # 41 steps in at most 10 buckets
        seen = json.loads(await page.eval(SEEN))
        assert any("/series?buckets=10&from=100&to=140" in u for u in seen), seen
        xs = json.loads(await page.eval("""JSON.stringify(document.getElementById('ce-chart').data
            .filter(t => t.name === '#1').flatMap(t => t.x))"""))
        assert xs and all(100 <= x <= 140 for x in xs), xs
        await page.eval("Plotly.relayout(document.getElementById('ce-chart'), {'xaxis.autorange': true}).then(() => true)")
        await page.until("window.steptailState.zooms >= 2 && window.steptailState.summary.zoom === null")
        assert not page.errors, page.errors


COMPARE_TRACES = """JSON.stringify(document.getElementById('compare-chart').data.map(
    t => ({name: t.name, width: t.line.width, dash: t.line.dash || null, n: t.x.length})))"""


@needs_chromium
async def test_compare_runs_against_a_control(served, chromium):  # noqa: F811
    """`?runs=live,rg&control=clean`: live is clean's first 150 steps (equal CE), rg another run."""
    async with tab(chromium) as page:
        await page.goto(f"{served.base}/?runs=live,rg&control=clean&buckets=400")
        state = await page.ready()
        assert state["view"] == "compare" and state["runs"] == ["live", "rg", "clean"] and state["control"] == "clean"
        arms = {a["arm"]: a for a in state["compare"]}
        assert set(arms) == {"live", "rg"}
        live = arms["live"]
        assert live["refused"] is None and live["first_divergent_step"] is None
        assert live["summary"]["steps_compared"] == 150 and live["summary"]["max_abs_delta"] == 0
        traces = json.loads(await page.eval(COMPARE_TRACES))
        # the control beneath (drawn first), wider and dashed: an identical arm on it leaves it visible
        assert traces[0]["name"] == "control: clean" and traces[0]["dash"] == "dash"
        arm = next(t for t in traces if t["name"] == "live")
        assert traces[0]["width"] > 3 * arm["width"] and arm["n"] == 150
        # the config rows are the route's, arm vs control and incarnation vs incarnation
        api = json.loads(await page.eval("""fetch('api/compare?arm=rg&control=clean&buckets=400')
            .then(r => r.text())"""))
        want = [[f"rg #{api['config']['arm_incarnation']} vs clean #{api['config']['control_incarnation']}", n, a, b]
                for n, a, b in api["config"]["arm_vs_control"]]
        assert [r for r in state["config"] if r[0].startswith("rg #")][:len(want)] == want
        if api["refused"] is None:
            assert arms["rg"]["summary"] == api["summary"]
        note = await page.eval("document.getElementById('delta-note').textContent")
        assert "live: 150 common steps" in note and "within ±0.001 everywhere" in note
        assert not page.errors, page.errors

        await page.goto(f"{served.base}/?runs=clean,nope&control=clean")
        state = await page.ready()
        assert state["missing"] == ["nope"]
        assert "no run nope in the store" in await page.eval("document.getElementById('compare-note').textContent")
        assert all("404 (Not Found)" in e and "nope" in e for e in page.errors), page.errors  # the browser's own log


FIGURE = """JSON.stringify((() => { const c = document.getElementById('ce-chart');
    return {layout: {x: c.layout.xaxis.type, y: c.layout.yaxis.type, title: c.layout.xaxis.title.text,
                     shapes: c.layout.shapes.length},
            traces: c.data.map(t => ({name: t.name, x: t.x, y: t.y, opacity: t.opacity === undefined ? 1 : t.opacity}))};
    })())"""


@needs_chromium
async def test_time_axes_smoothing_log_and_step_times(served, chromium):  # noqa: F811
    store = open_store(served.url)
    try:
        with store.engine.connect() as conn:
            t0, t1 = conn.execute(sa.text("SELECT MIN(ts_ns), MAX(ts_ns) FROM loss_parts WHERE run = 'rg'")).one()
            paces = conn.execute(sa.text("SELECT COUNT(*) FROM pod_metrics WHERE run = 'rg'")).scalar()
            first2 = conn.execute(sa.text("SELECT MIN(ts_ns) FROM loss_parts WHERE run = 'rg' AND incarnation = 2")).scalar()
    finally:
        store.dispose()
    async with tab(chromium) as page:
        await page.goto(f"{served.base}/?run=rg&x=elapsed")
        await page.until("window.steptailState.ready && window.steptailState.aids && window.steptailState.aids.timed")
        fig = json.loads(await page.eval(FIGURE))
        assert fig["layout"]["x"] == "linear" and fig["layout"]["title"] == "hours since the first step"
        xs = [x for t in fig["traces"] for x in t["x"] if x is not None]
        assert min(xs) == 0 and abs(max(xs) - (t1 - t0) / 3.6e12) < 1e-3
        # incarnation 2 (its replay of steps 151-180) starts after incarnation 1 ended in time
        two = [x for t in fig["traces"] if t["name"] == "#2" for x in t["x"] if x is not None]
        assert abs(min(two) - (first2 - t0) / 3.6e12) < 1e-3 and fig["layout"]["shapes"] == 1

        await page.goto(f"{served.base}/?run=rg&x=time&smooth=0.9&log=1")
        await page.until("window.steptailState.ready && window.steptailState.aids && window.steptailState.aids.timed")
        fig = json.loads(await page.eval(FIGURE))
        assert (fig["layout"]["x"], fig["layout"]["y"]) == ("date", "log")
        raw = next(t for t in fig["traces"] if t["name"] == "#1")
        smooth = next(t for t in fig["traces"] if t["name"] == "#1 smoothed")
        assert raw["opacity"] == 0.3 and len(smooth["y"]) == len(raw["y"]) and abs(smooth["y"][0] - raw["y"][0]) < 1e-9
        finite = [(a, b) for a, b in zip(raw["y"], smooth["y"], strict=True) if a is not None]
        steps = [abs(b2 - b1) for (_, b1), (_, b2) in zip(finite, finite[1:], strict=False)]
        jumps = [abs(a2 - a1) for (a1, _), (a2, _) in zip(finite, finite[1:], strict=False)]
        assert sum(steps) < sum(jumps)  # smoother than the raw line
        assert "x=time" in await page.eval("location.search")  # kept in the address

        state = await page.state()
        assert state["pace"]["rows"] == paces and state["pace"]["incarnations"] == ["#1", "#2"]
        await page.eval("""(() => { const s = document.getElementById('pace-select'); s.value = 'tokens_per_s';
            s.dispatchEvent(new Event('change')); return true; })()""")
        assert await page.eval("document.getElementById('pace-chart').layout.yaxis.title.text") == "tokens/s/device"

        await page.goto(f"{served.base}/?run=nan&x=time")  # a log without timestamps: by step, and says so
        await page.until("window.steptailState.ready && window.steptailState.aids && window.steptailState.aids.timed === false")
        assert "no timestamps" in await page.eval("document.getElementById('x-note').textContent")
        assert json.loads(await page.eval(FIGURE))["layout"]["x"] != "date"
        assert not page.errors, page.errors


LONG = ("stream 0b7f3c2e-9a41-4c55-8e2d-5f1a2b3c4d5e stopped answering while the collector followed it; "
        "the kubelet's log rotation dropped 41 lines between two reads, so steps 10-12 were never seen "
        "and cannot be recovered from this pod's logs")


@needs_chromium
async def test_overview_sparklines_followed_first_short_details_and_an_unknown_run(served, chromium):  # noqa: F811
    store = open_store(served.url)
    try:
        with store.engine.begin() as conn:  # rg followed now, its last step days old: stalled
            conn.execute(sa.text("INSERT INTO run_sources (run, source, added_ns) VALUES ('rg', 'kubernetes:default/rg', 1)"))
            conn.execute(sa.text("UPDATE runs SET followed_ns = :now, updated_ns = updated_ns + 1 WHERE run = 'rg'"),
                         {"now": time.time_ns()})
            conn.execute(sa.text(
                "INSERT INTO findings (run, kind, incarnation, first_step, last_step, detail, severity, detected_ns)"
                " VALUES ('clean', 'gap', 1, 10, 12, :detail, 'warning', 1)"), {"detail": LONG})
            conn.execute(sa.text("UPDATE runs SET updated_ns = updated_ns + 1 WHERE run = 'clean'"))
    finally:
        store.dispose()
    async with tab(chromium) as page:
        await page.goto(f"{served.base}/")
        state = await page.ready()
        assert state["runs"][0] == "rg"  # followed runs first
        rows = json.loads(await page.eval("""JSON.stringify([...document.querySelectorAll('#runs-table tbody tr')]
            .map(tr => [tr.dataset.run, tr.dataset.state, Number(tr.querySelector('svg.spark').dataset.points),
                        tr.querySelectorAll('svg.spark polyline').length]))"""))
        assert rows[0][:2] == ["rg", "stalled"] and [r[0] for r in rows[1:]] == sorted(r[0] for r in rows[1:])
        for run, _, points, lines in rows:
            api = json.loads(await page.eval(f"""fetch('api/runs/' + encodeURIComponent({json.dumps(run)})
                + '/series?buckets=60').then(r => r.text())"""))
            col = api["columns"].index("ce_last")
            want = sum(isinstance(r[col], float | int) for i in api["incarnations"] for r in i["rows"])
            assert points == want and points > 1 and lines == len(api["incarnations"]), run

        await page.goto(f"{served.base}/?run=clean")
        await page.ready()
        cell = json.loads(await page.eval("""JSON.stringify([...document.querySelectorAll('#findings-table td.detail')]
            .map(td => { const d = td.querySelector('details');
                         return d ? [d.querySelector('summary').textContent, d.querySelector('.full').textContent,
                                     d.open] : null; }).filter(Boolean))"""))
        assert len(cell) == 1
        short, full, shown = cell[0]
        assert full == LONG and shown is False  # one click away
        assert "0b7f3c2e" not in short and len(short) <= 90 and short.startswith("stream … stopped answering")
        await page.eval("document.querySelector('#findings-table details summary').click()")
        renders = await page.eval("window.steptailState.renders")
        assert await page.eval("document.querySelector('#findings-table details').open") is True
        store = open_store(served.url)
        try:  # a refresh rebuilds the table: what the reader opened stays open
            with store.engine.begin() as conn:
                conn.execute(sa.text("UPDATE runs SET updated_ns = updated_ns + 1 WHERE run = 'clean'"))
        finally:
            store.dispose()
        await page.until(f"window.steptailState.renders > {renders}")
        assert await page.eval("document.querySelector('#findings-table details').open") is True

        await page.goto(f"{served.base}/?run=nope")
        state = await page.ready()
        assert state["missing"] is True
        assert "No run nope" in await page.eval("document.getElementById('run-facts').textContent")
        assert await page.eval("document.getElementById('ce-chart').offsetHeight") == 0  # no empty chart frame
        assert await page.eval("document.getElementById('ce-chart').children.length") == 0
        assert all("404 (Not Found)" in e for e in page.errors), page.errors


@needs_chromium
async def test_first_draw_asks_no_rbf_counts_nor_per_layer_rbf_until_the_panel_opens(served, chromium):  # noqa: F811
    async with tab(chromium) as page:
        await page.goto(f"{served.base}/?run=rg&summary=0&buckets=10")
        await page.ready()
        await page.until("window.steptailState.rbf.covered.length > 0")  # the strip, from the full /series
        seen = json.loads(await page.eval(SEEN))
        series = [u for u in seen if "/series?" in u]
        assert series[0].endswith("/series?buckets=10&rbf=0"), series  # the first draw's: no REQUIRED_RBF counts
        assert any(u.endswith("/series?buckets=10") for u in series), series  # then the strip's
        assert not [u for u in seen if "rbf-layers" in u or "rbf_per_layer" in u], seen
        assert await page.eval("window.steptailState.rbfLayers === undefined")

        await page.eval("document.getElementById('rbf-panel').open = true")  # the user opens the panel
        await page.until("window.steptailState.rbfLayers && window.steptailState.rbfLayers.asked === 1")
        seen = json.loads(await page.eval(SEEN))
        assert [u for u in seen if "rbf-layers" in u][0].endswith("/rbf-layers?buckets=200")
        api = json.loads(await page.eval("fetch('api/runs/rg/rbf-layers?buckets=200').then(r => r.text())"))
        z = json.loads(await page.eval("""JSON.stringify(document.getElementById('rbf-layers-chart').data
            .map(t => ({name: t.name, z: t.z, n: t.x.length})))"""))
        assert [t["name"] for t in z] == [f"#{i['incarnation']}" for i in api["incarnations"]] == ["#1", "#2"]
        first = api["incarnations"][0]["rows"]
        assert z[0]["n"] == len(first) and len(z[0]["z"]) == api["layers"] > 1
        assert [row[0] for row in z[0]["z"][:1]][0] == first[0][5][0]  # layer 0 of the first bucket

        # a zoom asks it again for the range on screen
        await page.eval("Plotly.relayout(document.getElementById('ce-chart'), {'xaxis.range': [100.4, 139.6]}).then(() => true)")
        await page.until("window.steptailState.rbfLayers.asked === 2")
        state = await page.state()
        assert (state["rbfLayers"]["from"], state["rbfLayers"]["to"], state["rbfLayers"]["stride"]) == (100, 140, 1)
        assert any(u.endswith("/rbf-layers?buckets=200&from=100&to=140") for u in json.loads(await page.eval(SEEN)))
        assert not page.errors, page.errors


@needs_chromium
async def test_a_zoom_of_compare_asks_every_run_and_delta_again(served, chromium):  # noqa: F811
    async with tab(chromium) as page:
        await page.goto(f"{served.base}/?runs=live,rg&control=clean&buckets=400")
        await page.ready()
        await page.eval("Plotly.relayout(document.getElementById('compare-chart'), {'xaxis.range': [100.4, 139.6]}).then(() => true)")
        await page.until("window.steptailState.zooms >= 1 && JSON.stringify(window.steptailState.zoom) === '[100,140]'")
        seen = json.loads(await page.eval(SEEN))
        for run in ("live", "rg", "clean"):
            assert any(u.endswith(f"/runs/{run}/series?buckets=400&from=100&to=140") for u in seen), (run, seen)
        for arm in ("live", "rg"):
            assert any(f"api/compare?arm={arm}&control=clean&buckets=400&from=100&to=140" in u for u in seen), seen
        xs = json.loads(await page.eval("""JSON.stringify(document.getElementById('compare-chart').data
            .flatMap(t => t.x).filter(x => x !== null))"""))
        assert xs and all(100 <= x <= 140 for x in xs)
        dxs = json.loads(await page.eval("""JSON.stringify(document.getElementById('delta-chart').data
            .flatMap(t => t.x).filter(x => x !== null))"""))
        assert dxs and all(100 <= x <= 140 for x in dxs)
        assert await page.eval("JSON.stringify(document.getElementById('delta-chart').layout.xaxis.range)") == "[99.5,140.5]"
        await page.eval("Plotly.relayout(document.getElementById('delta-chart'), {'xaxis.autorange': true}).then(() => true)")
        await page.until("window.steptailState.zooms >= 2 && window.steptailState.zoom === null")
        assert not page.errors, page.errors


def _iso(ns: int) -> str:
    """plotly's date-axis text of a time (UTC)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ns // 10**9)) + f".{ns % 10**9 // 10**6:03d}"


@needs_chromium
async def test_a_zoom_on_the_time_axes_asks_that_step_range(served, chromium):  # noqa: F811
    store = open_store(served.url)
    try:
        with store.engine.connect() as conn:
            at = dict(conn.execute(sa.text("SELECT step, ts_ns FROM loss_parts WHERE run = 'rg' AND incarnation = 1"
                                           " AND step IN (50, 100, 140)")).all())
            t0 = conn.execute(sa.text("SELECT MIN(ts_ns) FROM loss_parts WHERE run = 'rg'")).scalar()
    finally:
        store.dispose()
    async with tab(chromium) as page:
        for x, range_ in (("time", [_iso(at[100]), _iso(at[140])]),
                          ("elapsed", [(at[100] - t0) / 3.6e12, (at[140] - t0) / 3.6e12])):
            await page.goto(f"{served.base}/?run=rg&summary=0&buckets=10&x={x}")
            await page.until("window.steptailState.ready && window.steptailState.aids && window.steptailState.aids.timed")
            await page.eval(f"""Plotly.relayout(document.getElementById('ce-chart'),
                {{'xaxis.range': {json.dumps(range_)}}}).then(() => true)""")
            await page.until("window.steptailState.zooms >= 1 && window.steptailState.summary.zoom !== null")
            state = await page.state()
            lo, hi = state["summary"]["zoom"]
            # the buckets (48 steps wide) stamped in that time: steps 96-143 of incarnation 1
            assert lo <= 100 and hi >= 140 and hi - lo < 100, (x, lo, hi)
            seen = json.loads(await page.eval(SEEN))
            assert any(u.endswith(f"/series?buckets=10&from={lo}&to={hi}") for u in seen), seen
            await page.until("window.steptailState.summary.width < 48")
            fig = json.loads(await page.eval(FIGURE))
            xs = [v for t in fig["traces"] if t["name"] == "#1" for v in t["x"] if v is not None]
            assert fig["layout"]["x"] == ("date" if x == "time" else "linear")
            if x == "elapsed":  # still hours since the run's first step, not since the range's
                assert min(xs) >= (at[100] - t0) / 3.6e12 - 0.05 and min(xs) > 0
            else:  # zooming out beyond the steps read: mapped by the whole run's buckets
                await page.eval(f"""Plotly.relayout(document.getElementById('ce-chart'),
                    {{'xaxis.range': {json.dumps([_iso(at[50]), _iso(at[140])])}}}).then(() => true)""")
                await page.until("window.steptailState.zooms >= 2")
                await page.until("window.steptailState.summary.zoom[0] <= 50")
        assert not page.errors, page.errors


@needs_chromium
async def test_config_params_that_differ_between_two_incarnations(served, chromium):  # noqa: F811
    added = [(1, "learning_rate", "1e-5"), (2, "learning_rate", "2e-5"), (2, "warmup_steps", "100")]
    store = open_store(served.url)
    try:
        with store.engine.begin() as conn:
            for inc, name, value in added:
                conn.execute(sa.text("INSERT INTO config (run, incarnation, name, value) VALUES ('rg', :i, :n, :v)"),
                             {"i": inc, "n": name, "v": value})
            conn.execute(sa.text("UPDATE runs SET updated_ns = updated_ns + 1 WHERE run = 'rg'"))
        async with tab(chromium) as page:
            await page.goto(f"{served.base}/?run=rg")
            await page.until("window.steptailState.ready && window.steptailState.configDiff")
            diff = (await page.state())["configDiff"]
            # the latest against the one before, by default: what the restart changed
            assert diff == {"a": 2, "b": 1, "rows": [["learning_rate", "2e-5", "1e-5"], ["warmup_steps", "100", None]]}
            cells = json.loads(await page.eval("""JSON.stringify([...document.querySelectorAll('#inc-config-table tbody tr')]
                .map(tr => [...tr.children].map(td => td.textContent)))"""))
            assert cells == [["learning_rate", "2e-5", "1e-5"], ["warmup_steps", "100", "(not printed)"]]
            assert "2 params differ" in await page.eval("document.getElementById('inc-config-note').textContent")
            await page.eval("""(() => { const s = document.getElementById('config-a'); s.value = '1';
                s.dispatchEvent(new Event('change')); const t = document.getElementById('config-b'); t.value = '2';
                t.dispatchEvent(new Event('change')); return true; })()""")
            diff = (await page.state())["configDiff"]
            assert diff["a"] == 1 and diff["rows"] == [["learning_rate", "1e-5", "2e-5"], ["warmup_steps", None, "100"]]

            await page.goto(f"{served.base}/?run=clean")  # one incarnation: nothing to diff
            await page.until("window.steptailState.ready && window.steptailState.view === 'run'")
            await page.until("document.getElementById('inc-config-note').textContent.length > 0")
            assert "Only one incarnation" in await page.eval("document.getElementById('inc-config-note').textContent")
            assert await page.eval("document.getElementById('inc-config-table').hidden") is True
            assert not page.errors, page.errors
    finally:
        with store.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM config WHERE run = 'rg' AND name IN ('learning_rate', 'warmup_steps')"))
            conn.execute(sa.text("UPDATE runs SET updated_ns = updated_ns + 1 WHERE run = 'rg'"))
        store.dispose()
