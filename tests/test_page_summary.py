"""A long run drawn from /api/runs/<run>/series (docs/page.md "A long run"), in real headless
Chromium on SQLite and PostgreSQL (tests/test_page.py's served store and browser).

`&summary=0` draws even a sample run from /series. At a bucket per step it must show what the
whole-steps view shows (gaps, NaN steps, REQUIRED_RBF coverage, step count); with wide buckets
the largest CE stays drawn (the buckets' max); a zoom asks /series again for that range only;
the steps read are the run's tail, without rbf_per_layer."""

from __future__ import annotations

import json

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
        assert state["summary"]["width"] == 40 and state["summary"]["drawn"] <= 20  # 2 incarnations
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
