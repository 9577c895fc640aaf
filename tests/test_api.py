"""The Python API (steptail.open): its frames hold what the CLI prints and the store keeps,
with the promised column types, on SQLite and on the real PostgreSQL."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pandas as pd
import pytest
from click.testing import CliRunner
from findings_logs import LogBuilder, store_lines
from store_fixtures import ingest_sample

import steptail
import steptail.storage.export as export_mod
from steptail.cli import main
from steptail.parsers import format_ns
from steptail.storage.export import verify
from steptail.storage.findings import load_findings

TS = "datetime64[ns, UTC]"
STEPS_TYPES = {"incarnation": "int64", "step": "int64", "ts": TS, "ce": "float64", "ce_raw": "string"}
PART_TYPES = {"z_loss": "float64", "moe_lb": "float64", "total": "float64", "tunix_loss": "float64",
              "weights": "Int64"}
RBF_TYPES = {"incarnation": "int64", "step": "int64", "ts": TS, "max": "float64", "per_layer": "object",
             "program": "string"}
RUNS_TYPES = {"run": "string", "jobset": "string", "namespace": "string", "sources": "object",
              "state": "string", "state_reason": "string", "incarnations": "int64", "steps": "int64", "max_step": "Int64", "last_step": "Int64",
              "last_ce": "float64", "last_ts": TS, "bad_lines": "int64", "updated": TS}
FINDINGS_TYPES = {"run": "string", "kind": "string", "incarnation": "int64", "first_step": "int64",
                  "last_step": "int64", "detail": "string", "severity": "string", "detected": TS}
GAPS_TYPES = {"kind": "string", "incarnation": "int64", "first_step": "int64", "last_step": "int64",
              "missing": "int64"}
STREAM_GAPS_TYPES = {"stream": "string", "start": TS, "end": TS, "reason": "string"}
COMPARE_TYPES = {"step": "int64", "arm_ce": "float64", "control_ce": "float64", "delta": "float64",
                 "beyond": "bool"}


def cli(*args) -> tuple[int, str]:
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return r.exit_code, r.output


def types(frame: pd.DataFrame) -> dict[str, str]:
    return {name: str(dtype) for name, dtype in frame.dtypes.items()}


def ns(value) -> int | None:
    return None if pd.isna(value) else value.value


def plain(value):
    """A frame cell as the JSON of the CLI has it: missing is None."""
    if isinstance(value, (list, dict)):
        return value
    return None if pd.isna(value) else value


@pytest.fixture
def url(store, samples):
    for run, name in (("rg", "resume-gap"), ("nan", "cp4-lb-nan")):
        ingest_sample(store, samples, run, name)
    return store.engine.url.render_as_string(hide_password=False)


@pytest.fixture
def st(url):
    with steptail.open(url) as api:
        yield api


def test_import_steptail_loads_no_pandas():
    code = "import sys, steptail; assert 'pandas' not in sys.modules and 'sqlalchemy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("run", ["rg", "nan"])
def test_steps_equal_steps_json(st, url, run):
    code, out = cli("steps", run, "--db", url, "--json")
    assert code == 0, out
    want = [r for r in json.loads(out) if r["ce_raw"] is not None]  # LOSS-PARTS rows
    as_dict = st.steps(run, parts="dict")
    assert types(as_dict) == {**STEPS_TYPES, "parts": "object"}
    got = [{"incarnation": r.incarnation, "step": r.step,
            "ts": None if ns(r.ts) is None else format_ns(ns(r.ts)),
            "ce": plain(r.ce), "ce_raw": r.ce_raw, "parts": r.parts}
           for r in as_dict.itertuples()]
    assert got == [{k: r[k] for k in ("incarnation", "step", "ts", "ce", "ce_raw", "parts")} for r in want]
    # the default spreads the parts over columns, non-finite words restored
    columns = st.steps(run)
    assert types(columns) == {**STEPS_TYPES, **PART_TYPES}
    for key in PART_TYPES:
        stored = [r["parts"][key] for r in want]
        spread = columns[key].tolist()
        restored = [float(v) if isinstance(v, str) else v for v in stored]
        assert all((math.isnan(a) and math.isnan(b)) if isinstance(a, float) and math.isnan(a) else a == b
                   for a, b in zip(spread, restored, strict=True)), key
    if run == "nan":
        row = columns.set_index("step").loc[77]
        assert math.isnan(row.ce) and row.ce_raw == "nan" and math.isnan(row.total)
        assert columns.ts.isna().all()  # no kubelet timestamps in that log


def test_step_filters_equal_the_cli(st, url):
    code, out = cli("steps", "rg", "--db", url, "--from", "150", "--to", "190", "--json")
    want = [(r["incarnation"], r["step"]) for r in json.loads(out) if r["ce_raw"] is not None]
    frame = st.steps("rg", from_step=150, to_step=190)
    assert list(zip(frame.incarnation, frame.step, strict=True)) == want
    assert {2} == set(st.steps("rg", incarnation=2).incarnation)
    replayed = st.steps("rg", incarnation=2, from_step=151, to_step=180)
    assert replayed.step.tolist() == list(range(151, 181))


def test_rbf_equals_steps_json(st, url):
    code, out = cli("steps", "rg", "--db", url, "--json")
    want = [r for r in json.loads(out) if r["rbf_per_layer"] is not None]
    frame = st.rbf("rg")
    assert types(frame) == RBF_TYPES and len(frame) == 424
    assert [(r.incarnation, r.step, plain(r.max), r.per_layer, plain(r.program)) for r in frame.itertuples()] == \
           [(r["incarnation"], r["step"], r["rbf_max"], r["rbf_per_layer"], r["rbf_program"]) for r in want]


def test_runs_equal_runs_json(st, url):
    code, out = cli("runs", "--db", url, "--json")
    assert code == 0, out
    frame = st.runs()
    assert types(frame) == RUNS_TYPES
    got = []
    for r in frame.to_dict("records"):
        r = {k: plain(v) for k, v in r.items()}
        for name in ("last_ts", "updated"):
            r[name] = None if r[name] is None else format_ns(r[name].value)
        got.append(r)
    assert got == json.loads(out)


def test_findings_equal_the_stored_ones(st, url, store):
    # ingest stored the samples' findings already; check agrees and adds none
    assert types(st.findings()) == FINDINGS_TYPES and not st.findings().empty
    for run in ("rg", "nan"):
        assert cli("check", run, "--db", url)[0] == 1
    with store.engine.connect() as conn:
        stored = {run: load_findings(conn, run) for run in ("rg", "nan")}
    for run in ("rg", "nan"):
        frame = st.findings(run)
        assert types(frame) == FINDINGS_TYPES
        assert [(r.run, r.kind, r.incarnation, r.first_step, r.last_step, r.detail, r.severity,
                 r.detected.value) for r in frame.itertuples()] == \
               [(f.run, f.kind, f.incarnation, f.first_step, f.last_step, f.detail, f.severity,
                 f.detected_ns) for f in stored[run]]
    every = st.findings()
    assert len(every) == len(stored["rg"]) + len(stored["nan"]) and set(every.run) == {"rg", "nan"}
    assert "nonfinite_ce" in set(st.findings("nan").kind)


def test_gaps_equal_the_export_manifest(st, tmp_path):
    frame = st.gaps("rg")
    assert types(frame) == GAPS_TYPES
    assert frame.to_dict("records") == [
        {"kind": "gap", "incarnation": 1, "first_step": 60, "last_step": 63, "missing": 4}]
    manifest = st.export("rg", tmp_path / "rg")
    assert [{k: g[k] for k in ("kind", "incarnation", "first_step", "last_step")}
            for g in manifest["gaps"]["steps"]] == frame.drop(columns="missing").to_dict("records")
    assert types(st.stream_gaps("rg")) == STREAM_GAPS_TYPES and st.stream_gaps("rg").empty


def test_compare_equals_compare_json(st, url):
    code, out = cli("compare", "rg", "nan", "--db", url, "--tolerance", "0.02", "--json")
    assert code == 1, out
    data = json.loads(out)
    frame = st.compare("rg", "nan", tolerance=0.02)
    assert types(frame) == COMPARE_TYPES
    assert [{k: plain(v) for k, v in r.items()} for r in frame.to_dict("records")] == data.pop("steps")
    assert frame.attrs["summary"] == data
    assert bool(frame.set_index("step").loc[77, "beyond"])  # nan on one side only


def test_unknown_runs_and_refusals(st, store):
    with pytest.raises(steptail.UnknownRun, match="no run 'nope'"):
        st.steps("nope")
    with pytest.raises(steptail.UnknownRun):
        st.compare("rg", "nope")
    with pytest.raises(ValueError, match="parts"):
        st.steps("rg", parts="wide")
    store_lines(store, "late", LogBuilder().start().steps(1000, 1010, ce=lambda s: 2.0).lines)
    with pytest.raises(steptail.CompareRefused, match="no step in common"):
        st.compare("rg", "late")


def test_context_manager_closes_the_store(url):
    closed = []
    with steptail.open(url) as st:
        st.store.dispose = lambda: closed.append(True)
        assert len(st.runs()) == 2
    assert closed == [True]


def test_export_creates_missing_parents(url, tmp_path):
    out = tmp_path / "ledger" / "2026" / "rg"
    code, text = cli("export", "rg", "--out", str(out), "--db", url)
    assert code == 0, text
    assert verify(out) == [] and (out / "manifest.json").is_file()


def test_failed_export_removes_the_parents_it_made(st, tmp_path, monkeypatch):
    def boom(*_a, **_k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(export_mod, "plot_ce", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        st.export("rg", tmp_path / "a" / "b" / "rg")
    assert not (tmp_path / "a").exists()
