"""Every panel, annotation, variable and alert-rule query, as rendered, with Grafana's macros
and variables expanded, runs on the real PostgreSQL loaded with the sample logs (tests/samples) and
returns the expected series."""

from __future__ import annotations

import json
import statistics
import time
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from store_fixtures import PG_ADMIN, ingest_sample, samples_dir

from steptail.dashboards import queries as q
from steptail.dashboards.macros import Context, MacroError, TimeRange, Variable, expand
from steptail.dashboards.render import dashboards_json, rules_json
from steptail.storage.db import open_store
from steptail.storage.scratch import scratch_database

RUNS = ("clean-300", "resume-gap", "resume-mismatch", "cp4-lb-nan", "resume-from-zero")
T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)  # the samples run 04:00-05:30 UTC
T1 = datetime(2026, 11, 30, 7, 0, tzinfo=UTC)
NS = 1_000_000_000


def _ns(t: datetime) -> int:
    return int(t.timestamp()) * NS


FINDINGS = [  # what the detectors would write (steptail.runs.detectors)
    ("resume-gap", "gap", 1, 60, 63, "steps 60-63 missing", "warning"),
    ("cp4-lb-nan", "step1_ce_gate", 1, 1, 1, "step-1 ce differs from HF reference", "critical"),
    ("cp4-lb-nan", "nonfinite_ce", 1, 77, 77, "ce=nan", "critical"),
    ("resume-mismatch", "resume_mismatch", 2, 101, 120, "replayed CE +0.05", "critical"),
    ("clean-300", "step1_ce_gate", 1, 1, 1, "no HF reference: gate not run", "warning"),
]


@pytest.fixture(scope="module")
def pg():
    with scratch_database(PG_ADMIN, "steptail_test") as url:
        store = open_store(url)
        try:
            _load(store)
            yield store
        finally:
            store.dispose()


def _load(store) -> None:
    samples = samples_dir()
    for run in RUNS:
        ingest_sample(store, samples, run, run)
    detected = _ns(datetime(2026, 11, 30, 5, 0, tzinfo=UTC))
    with store.engine.begin() as conn:
        # ingest stored the samples' own findings; the queries are checked on a known set
        conn.execute(sa.text("DELETE FROM findings"))
        for row in FINDINGS:
            conn.execute(sa.text(
                "INSERT INTO findings (run, kind, incarnation, first_step, last_step, detail,"
                " severity, detected_ns) VALUES (:r, :k, :i, :a, :b, :d, :s, :t)"),
                dict(zip("rkiabds", row, strict=True), t=detected))
        conn.execute(sa.text("UPDATE runs SET namespace = 'team-a', jobset = 'js-a' WHERE run = 'clean-300'"))
        conn.execute(sa.text(
            "INSERT INTO stream_gaps (run, stream, start_ns, end_ns, reason, detected_ns)"
            " VALUES ('resume-gap', 'log', 1, 2, 'rotation', 3), ('resume-gap', 'log', 5, 6, 'eof', 7)"))
        conn.execute(sa.text(
            "INSERT INTO stream_reconnects (run, stream, ts_ns, reason)"
            " VALUES ('resume-gap', 'log', 4, 'silence'), ('resume-gap', 'log', 8, 'eof'),"
            " ('resume-gap', 'log', 9, 'eof')"))


def truth(run: str) -> dict:
    return json.loads((samples_dir() / f"{run}.truth.json").read_text())


def ctx(runs=("resume-gap",), namespaces=("-", "team-a"), start=T0, end=T1, points=q.POINTS_DEFAULT,
        max_data_points=1000) -> Context:
    return Context(
        TimeRange(start, end),
        {"run": Variable(list(runs), multi=True),
         "namespace": Variable(list(namespaces), multi=True, include_all=True),
         q.POINTS_VARIABLE: Variable([str(points)])},
        max_data_points,
    )


def run_sql(store, sql: str, c: Context) -> list[dict]:
    with store.engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(expand(sql, c).replace(":", r"\:"))).mappings()]


def rendered_queries() -> list[tuple[str, str]]:
    """(where, sql) for every SQL text in the rendered dashboards and alert rules."""
    out = []
    for uid, board in dashboards_json().items():
        for v in board["templating"]["list"]:
            if v["type"] == "query":  # a datasource variable's query is a plugin type
                out.append((f"{uid} variable {v['name']}", v["query"]))
        for a in board.get("annotations", {}).get("list", []):
            out.append((f"{uid} annotation {a['name']}", a["target"]["rawSql"]))
        for p in board["panels"]:
            for t in p.get("targets", []):
                out.append((f"{uid} panel {p['title']}", t["rawSql"]))
    for uid, rule in rules_json().items():
        for d in rule["data"]:
            if d["datasourceUid"] != "__expr__":
                out.append((f"rule {uid}", d["model"]["rawSql"]))
    return out


@pytest.mark.parametrize("where,sql", rendered_queries(), ids=[w for w, _ in rendered_queries()])
def test_every_rendered_query_runs(pg, where, sql):
    for runs in (("resume-gap",), RUNS):
        rows = run_sql(pg, sql, ctx(runs))
        assert isinstance(rows, list)


def _loss_truth(run):
    return [(f"{run} #{r['incarnation']}", r["step"], r["ce"]) for r in truth(run)["loss_parts"]]


def bucketed(rows: list[tuple], points: int, lo: int, hi: int, blocks: bool) -> list[tuple]:
    """What the by-step panels draw (queries._BUCKETED_BY_STEP), from (run, incarnation, step,
    y) rows: per bucket of the steps lo..hi its lowest y at its first step and highest at its
    last, and a None where a y is not finite or steps are missing. With `blocks` (CE: its
    loss_rollup), a bucket of 16 steps or more is made of whole blocks of 16."""
    width = 1 if points == 0 else max(1, -(-(hi - lo + 1) // points))
    if blocks and width >= q.BLOCK and lo >= 0:  # whole loss_rollup blocks
        lo, width = lo // q.BLOCK * q.BLOCK, -(-width // q.BLOCK) * q.BLOCK
    buckets: dict = {}
    for run, inc, step, y in rows:
        buckets.setdefault((run, inc, (step - lo) // width), []).append((step, y))
    out, prev = [], {}
    for (run, inc, _), got in sorted(buckets.items()):
        steps_ = [st for st, _ in got]
        ys = [y for _, y in got if y is not None]
        s0, s1 = min(steps_), max(steps_)
        if ys:
            out.append((run, inc, s0, min(ys), 0))
            if s1 > s0:
                out.append((run, inc, s1, max(ys), 1))
        if len(ys) < len(got):
            out.append((run, inc, min(st for st, y in got if y is None), None, 2))
        if (run, inc) in prev and s0 > prev[(run, inc)] + 1:
            out.append((run, inc, prev[(run, inc)] + 1, None, 3))
        if len(got) < s1 - s0 + 1:
            out.append((run, inc, s0 + 1, None, 4))
        prev[(run, inc)] = s1
    return [(f"{r} #{i}", st, y) for r, i, st, y, _ in sorted(out, key=lambda t: t[:3] + (t[4],))]


def _truth_rows(runs, table="loss_parts", y="ce") -> list[tuple]:
    return [(run, r["incarnation"], r["step"], r[y]) for run in runs for r in truth(run)[table]]


def _by_step_reference(runs, points, table="loss_parts", y="ce") -> list[tuple]:
    steps_ = [st for *_, st, _ in _truth_rows(runs)]
    return bucketed(_truth_rows(runs, table, y), points, min(steps_), max(steps_), table == "loss_parts")


def _drawn(rows, y="ce") -> list[tuple]:
    return [(r["series"], r["step"], r[y]) for r in rows]


@pytest.mark.parametrize("run", RUNS)
def test_ce_by_step_every_step_is_the_raw_series_with_its_breaks(pg, run):
    got = _drawn(run_sql(pg, q.CE_BY_STEP, ctx((run,), points=0)))
    assert got == _by_step_reference((run,), 0)
    finite = [(f"{run} #{i}", st, ce) for _, i, st, ce in _truth_rows((run,)) if ce is not None]
    assert [g for g in got if g[2] is not None] == sorted(finite, key=lambda t: (int(t[0].rsplit("#")[1]), t[1]))
    raw = _drawn(run_sql(pg, q.CE_BY_STEP_RAW, ctx((run,))))
    assert [g for g in raw if g[2] is not None] == [g for g in got if g[2] is not None]


def test_ce_by_step_breaks_the_line_at_a_nan_and_at_missing_steps(pg):
    gap = _drawn(run_sql(pg, q.CE_BY_STEP, ctx(("resume-gap",), points=0)))
    assert ("resume-gap #1", 60, None) in gap  # steps 60-63 missing: the line breaks at 60
    nan = _drawn(run_sql(pg, q.CE_BY_STEP, ctx(("cp4-lb-nan",), points=0)))
    assert ("cp4-lb-nan #1", 77, None) in nan
    # ... and still when a bucket holds many steps
    assert any(st is not None and ce is None and 60 <= st <= 64 for _, st, ce in
               _drawn(run_sql(pg, q.CE_BY_STEP, ctx(("resume-gap",), points=20))))
    assert any(ce is None and 70 <= st <= 84 for _, st, ce in
               _drawn(run_sql(pg, q.CE_BY_STEP, ctx(("cp4-lb-nan",), points=20))))


# 7, 19, 25: buckets of rollup blocks (25: 16 steps, the narrowest); 27, 40, 1000: of rows
@pytest.mark.parametrize("points", [7, 19, 25, 27, 40, 1000])
def test_ce_by_step_downsampled_keeps_each_buckets_extremes(pg, points):
    runs = ("resume-gap", "clean-300", "cp4-lb-nan")
    got = _drawn(run_sql(pg, q.CE_BY_STEP, ctx(runs, points=points)))
    assert got == _by_step_reference(runs, points)
    for series in {g[0] for g in got}:  # at most 2 values per bucket, plus the breaks
        assert len([g for g in got if g[0] == series and g[2] is not None]) <= 2 * points
    values = [ce for *_, ce in _truth_rows(runs) if ce is not None]
    drawn = [ce for *_, ce in got if ce is not None]
    assert (min(drawn), max(drawn)) == (min(values), max(values))  # no spike lost


def test_ce_by_step_multi_run_selection(pg):
    rows = [r for r in run_sql(pg, q.CE_BY_STEP, ctx(("resume-gap", "clean-300"), points=0))
            if r["ce"] is not None]
    assert {r["series"] for r in rows} == {"clean-300 #1", "resume-gap #1", "resume-gap #2"}
    assert len(rows) == len(_loss_truth("resume-gap")) + len(_loss_truth("clean-300"))
    steps_inc2 = [r["step"] for r in rows if r["series"] == "resume-gap #2"]
    assert steps_inc2[0] == 151  # restored from checkpoint 150: incarnations stay apart


def test_ce_over_time_is_time_filtered_series_per_incarnation(pg):
    fine = ctx(("resume-gap",), max_data_points=10**9)  # 1 ms buckets: every step
    rows = run_sql(pg, q.CE_OVER_TIME, fine)
    values = [r for r in rows if r["value"] is not None]
    assert len(values) == len(truth("resume-gap")["loss_parts"])
    assert len(rows) - len(values) == 1  # steps 60-63 missing: one break
    assert [r["time"] for r in rows] == sorted(r["time"] for r in rows)
    assert {r["metric"] for r in rows} == {"resume-gap #1", "resume-gap #2"}
    half = run_sql(pg, q.CE_OVER_TIME, ctx(("resume-gap",), end=datetime(2026, 11, 30, 4, 30, tzinfo=UTC),
                                           max_data_points=10**9))
    assert 0 < len(half) < len(rows)
    assert all(r["time"] <= datetime(2026, 11, 30, 4, 30, tzinfo=UTC) for r in half)
    # cp4-lb-nan has no kubelet timestamps: nothing to place on a time axis
    assert run_sql(pg, q.CE_OVER_TIME, ctx(("cp4-lb-nan",))) == []


def test_ce_over_time_draws_at_most_two_points_per_interval(pg):
    c = ctx(("resume-gap", "clean-300"), max_data_points=50)
    rows = run_sql(pg, q.CE_OVER_TIME, c)
    width_ns = c.interval_ms * 1_000_000
    per_bucket: dict = {}
    for r in rows:
        if r["value"] is not None:
            key = (r["metric"], int(r["time"].timestamp() * 1e9) // width_ns)
            per_bucket[key] = per_bucket.get(key, 0) + 1
    assert per_bucket and max(per_bucket.values()) <= 2
    values = [r["ce"] for run in ("resume-gap", "clean-300") for r in truth(run)["loss_parts"]
              if r["ce"] is not None]
    drawn = [r["value"] for r in rows if r["value"] is not None]
    assert (min(drawn), max(drawn)) == (min(values), max(values))
    assert any(r["value"] is None for r in rows if r["metric"] == "resume-gap #1")  # the gap


def test_step_time_and_tokens_per_s_come_from_pod_metrics(pg):
    with pg.engine.connect() as conn:
        n_sec, n_tok = conn.execute(sa.text(
            "SELECT COUNT(seconds), COUNT(tokens_per_s) FROM pod_metrics WHERE run = 'clean-300'")).one()
    secs = run_sql(pg, q.STEP_SECONDS, ctx(("clean-300",)))
    toks = run_sql(pg, q.TOKENS_PER_S, ctx(("clean-300",)))
    assert len(secs) == n_sec > 250 and len(toks) == n_tok > 250
    assert all(r["value"] > 0 for r in secs + toks)


def test_rbf_max_by_step_and_per_layer_heatmap(pg):
    rows = run_sql(pg, q.RBF_MAX_BY_STEP, ctx(("resume-gap",), points=0))
    want = sorted((f"resume-gap #{r['incarnation']}", r["step"], r["max"])
                  for r in truth("resume-gap")["required_rbf"])
    assert sorted((r["series"], r["step"], r["max"]) for r in rows if r["max"] is not None) == want
    for points in (0, 30):
        assert _drawn(run_sql(pg, q.RBF_MAX_BY_STEP, ctx(("resume-gap",), points=points)), "max") == \
            _by_step_reference(("resume-gap",), points, "required_rbf", "max")
    cells = run_sql(pg, q.RBF_PER_LAYER, ctx(("resume-gap",)))
    with pg.engine.connect() as conn:
        n_cells = conn.execute(sa.text(
            "SELECT SUM(jsonb_array_length(per_layer)) FROM required_rbf WHERE run = 'resume-gap'")).scalar()
    assert len(cells) == n_cells
    layers = sorted({r["metric"] for r in cells})
    assert layers[0] == "layer 000" and len(layers) == 16
    # each step's max is the max over its layers
    by_time: dict = {}
    for r in cells:
        by_time.setdefault(r["time"], []).append(r["value"])
    assert max(max(v) for v in by_time.values()) == pytest.approx(max(r["max"] for r in rows if r["max"] is not None))


def test_findings_annotations_span_the_steps_they_cover(pg):
    rows = run_sql(pg, q.FINDINGS_ANNOTATIONS, ctx(RUNS))
    gap = next(r for r in rows if "gap" in r["tags"])
    with pg.engine.connect() as conn:
        t59, t64 = (conn.execute(sa.text(
            "SELECT ts_ns FROM loss_parts WHERE run = 'resume-gap' AND incarnation = 1 AND step = :s"),
            {"s": s}).scalar() for s in (59, 64))
    assert gap["time"].timestamp() == pytest.approx(t59 / NS, abs=1e-3)
    assert gap["timeend"].timestamp() == pytest.approx(t64 / NS, abs=1e-3)
    assert gap["text"].startswith("resume-gap: gap (steps 60-63)")
    assert {r["tags"].split(",")[0] for r in rows} == {k for _, k, *_ in FINDINGS}
    # only the selected runs, and only inside the time range
    assert {r["text"].split(":")[0] for r in run_sql(pg, q.FINDINGS_ANNOTATIONS, ctx(("resume-gap",)))} == {"resume-gap"}
    assert run_sql(pg, q.FINDINGS_ANNOTATIONS, ctx(RUNS, end=datetime(2026, 11, 30, 4, 0, 5, tzinfo=UTC))) == []


def test_a_finding_not_tied_to_a_step_is_drawn_where_it_was_detected(pg):
    """A runbook rule the live JobSet breaks (first_step -1): a point at its detection time,
    not a span back to the run's first step."""
    at = _ns(datetime(2026, 11, 30, 4, 30, tzinfo=UTC))
    with pg.engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO findings (run, kind, incarnation, first_step, last_step, detail, severity, detected_ns)"
            " VALUES ('resume-gap', 'rule:queue', 0, -1, -1, 'queue ''hero'' is not ours', 'critical', :t)"),
            {"t": at})
    try:
        (rule,) = [r for r in run_sql(pg, q.FINDINGS_ANNOTATIONS, ctx()) if r["tags"].startswith("rule:queue,")]
        assert rule["time"].timestamp() == rule["timeend"].timestamp() == pytest.approx(at / NS, abs=1e-3)
        assert rule["text"] == "resume-gap: rule:queue queue 'hero' is not ours"
    finally:
        with pg.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM findings WHERE kind = 'rule:queue'"))


def test_fleet_lists_every_run(pg):
    rows = {r["run"]: r for r in run_sql(pg, q.FLEET, ctx())}
    assert set(rows) == set(RUNS)
    assert (rows["resume-gap"]["incarnation"], rows["resume-gap"]["last_step"]) == (2, 400)
    assert rows["clean-300"]["last_step"] == 300 and rows["clean-300"]["namespace"] == "team-a"
    assert rows["resume-gap"]["reconnects"] == 3 and rows["clean-300"]["reconnects"] == 0
    assert rows["resume-gap"]["stream_gaps"] == 2 and rows["clean-300"]["stream_gaps"] == 0
    assert rows["cp4-lb-nan"]["open_findings"] == 2 and rows["clean-300"]["open_findings"] == 1 and rows["resume-from-zero"]["open_findings"] == 0
    assert rows["cp4-lb-nan"]["seconds_since_last_step"] is None  # no timestamps
    last = datetime(2026, 11, 30, 5, 26, 6, tzinfo=UTC).timestamp()
    since = float(rows["resume-gap"]["seconds_since_last_step"])
    assert since == pytest.approx(time.time() - last, abs=120)
    only_a = run_sql(pg, q.FLEET, ctx(namespaces=("team-a",)))
    assert [r["run"] for r in only_a] == ["clean-300"]


def test_fleet_lists_the_runs_seen_since_the_range_began(pg):
    """A run neither written to nor logging a step since the range's start is history."""
    with pg.engine.begin() as conn:
        conn.execute(sa.text("UPDATE runs SET updated_ns = :t WHERE run IN ('clean-300', 'cp4-lb-nan')"),
                     {"t": _ns(T0 - timedelta(days=2))})
    try:
        since_t0 = {r["run"] for r in run_sql(pg, q.FLEET, ctx())}
        assert since_t0 == set(RUNS) - {"cp4-lb-nan"}  # clean-300 logged steps in the range
        later = {r["run"] for r in run_sql(pg, q.FLEET, ctx(start=T1, end=T1 + timedelta(hours=1)))}
        assert later == set(RUNS) - {"cp4-lb-nan", "clean-300"}  # the others were written today
    finally:
        with pg.engine.begin() as conn:
            conn.execute(sa.text("UPDATE runs SET updated_ns = :t WHERE run IN ('clean-300', 'cp4-lb-nan')"),
                         {"t": time.time_ns()})


def test_goodput_per_run_seen_in_the_range(pg):
    """The Fleet board's goodput panel: the figures kept at commit (run_goodput), one row per run
    that logged a step in the range, the same as `steptail goodput`; none for a later range."""
    from steptail.storage.goodput import run_goodput

    rows = {r["run"]: r for r in run_sql(pg, q.GOODPUT, ctx())}
    assert set(rows) == set(RUNS) - {"cp4-lb-nan"}  # no timestamps: no step in any range
    for run, row in rows.items():
        g = run_goodput(pg, run)
        assert row["goodput"] == pytest.approx(g["goodput"]) and 0.6 < row["goodput"] <= 1.0
        assert row["replayed_s"] == pytest.approx(g["replayed_s"])
        assert row["median_step_s"] == pytest.approx(g["incarnations"][-1]["median_step_s"])
    assert (rows["clean-300"]["replayed_s"] == 0) and rows["resume-gap"]["replayed_s"] > 0
    assert [r["run"] for r in run_sql(pg, q.GOODPUT, ctx(namespaces=("team-a",)))] == ["clean-300"]
    assert run_sql(pg, q.GOODPUT, ctx(start=T1, end=T1 + timedelta(hours=1))) == []


def test_variables(pg):
    assert [r for (r,) in (tuple(x.values()) for x in run_sql(pg, q.VAR_NAMESPACE, ctx()))] == ["-", "team-a"]
    runs = [tuple(x.values())[0] for x in run_sql(pg, q.VAR_RUN, ctx(namespaces=("team-a",)))]
    assert runs == ["clean-300"]
    assert len(run_sql(pg, q.VAR_RUN, ctx())) == len(RUNS)


def _alert(pg, sql, end):
    rows = run_sql(pg, sql, ctx(start=end - timedelta(seconds=q.ALERT_WINDOW_S), end=end))
    return {r["run"]: list(r.values())[1] for r in rows}


def test_alert_missing_steps(pg):
    got = _alert(pg, q.ALERT_MISSING_STEPS, T1)
    assert got["resume-gap"] == 4  # steps 60-63
    assert got["clean-300"] == 0 and got["resume-mismatch"] == 0
    assert "cp4-lb-nan" not in got  # no timestamps: never "active"
    assert _alert(pg, q.ALERT_MISSING_STEPS, T1 + timedelta(days=1)) == {}  # old runs: quiet


def test_alert_missing_steps_counts_head_gap(pg):
    with pg.engine.begin() as conn:
        conn.execute(sa.text("UPDATE incarnations SET first_step = 5 WHERE run = 'clean-300'"))
    try:
        assert _alert(pg, q.ALERT_MISSING_STEPS, T1)["clean-300"] == 4
    finally:
        with pg.engine.begin() as conn:
            conn.execute(sa.text("UPDATE incarnations SET first_step = 1 WHERE run = 'clean-300'"))


def test_alert_missing_steps_counts_a_head_never_read(pg):
    """Neither the start-up nor a restore line read, first step 31: steps 1-30 (runs.gaps)."""
    with pg.engine.begin() as conn:
        conn.execute(sa.text("UPDATE incarnations SET first_step = 31, saw_start = false WHERE run = 'clean-300'"))
    try:
        assert _alert(pg, q.ALERT_MISSING_STEPS, T1)["clean-300"] == 30
    finally:
        with pg.engine.begin() as conn:
            conn.execute(sa.text("UPDATE incarnations SET first_step = 1, saw_start = true WHERE run = 'clean-300'"))


def test_alert_stall(pg):
    with pg.engine.connect() as conn:
        ts = [t for (t,) in conn.execute(sa.text(
            "SELECT ts_ns FROM loss_parts WHERE run = 'clean-300' ORDER BY step DESC LIMIT 101"))]
    median = statistics.median(a - b for a, b in zip(ts, ts[1:], strict=False))
    last_t = datetime.fromtimestamp(ts[0] // NS, UTC)
    soon = _alert(pg, q.ALERT_STALL, last_t + timedelta(seconds=2))
    late = _alert(pg, q.ALERT_STALL, last_t + timedelta(minutes=30))
    assert soon["clean-300"] < q.STALL_FACTOR < late["clean-300"]
    want = (_ns(last_t + timedelta(minutes=30)) - ts[0]) / median
    assert late["clean-300"] == pytest.approx(want, rel=1e-9)
    assert "cp4-lb-nan" not in late


def test_alert_step1_gate_and_divergence(pg):
    gate = _alert(pg, q.ALERT_STEP1_GATE, T1)
    assert gate["cp4-lb-nan"] == 1 and gate["clean-300"] == 0  # a gate without reference: no alert
    div = _alert(pg, q.ALERT_DIVERGENCE, T1)
    assert div["resume-mismatch"] == 1 and div["cp4-lb-nan"] == 1 and div["resume-gap"] == 0


def test_macro_expansion_follows_grafana():
    c = Context(TimeRange(T0, T1), {"run": Variable(["a", "o'b"], multi=True),
                                    "one": Variable(["x'y"])})
    assert expand("run IN ($run)", c) == "run IN ('a','o''b')"
    assert expand("${run:sqlstring}|${one:sqlstring}", c) == "'a','o''b'|'x''y'"
    assert expand("[[one]]-${one}", c) == "x''y-x''y"
    assert expand("$__unixEpochNanoFilter(ts_ns)", c) == (
        f"ts_ns >= {_ns(T0)} AND ts_ns <= {_ns(T1)}")
    assert expand("$__timeFilter(t)", c) == "t BETWEEN '2026-11-30T03:00:00Z' AND '2026-11-30T07:00:00Z'"
    assert expand("$__unknownVar", c) == "$__unknownVar"
    with pytest.raises(MacroError):
        expand("$__nope(x)", c)
