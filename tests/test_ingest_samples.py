"""Every sample log (tests/samples), ingested into SQLite and PostgreSQL, reads back as its ground truth."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from steptail.cli import main

SAMPLES = ["clean-300", "resume-gap", "resume-mismatch", "cp4-lb-nan", "resume-from-zero"]


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_matches_truth(name, db_url, samples):
    truth = json.loads((samples / f"{name}.truth.json").read_text())
    code, out = run_cli("ingest", str(samples / f"{name}.log"), "--run", name, "--db", db_url, "--json")
    assert code == 0, out
    summary = json.loads(out)
    assert summary["loss_parts"] == len(truth["loss_parts"])
    assert summary["required_rbf"] == len(truth["required_rbf"])
    assert summary["pod_steps"] == truth["pod_steps"]
    assert summary["incarnations"] == truth["incarnations"]
    assert summary["bad_lines"] == 0

    code, out = run_cli("steps", name, "--db", db_url, "--json")
    assert code == 0, out
    rows = json.loads(out)
    keys = {(r["incarnation"], r["step"]) for r in rows}
    assert len(keys) == len(rows)
    by_key = {(r["incarnation"], r["step"]): r for r in rows}

    # Every LOSS-PARTS record, in log order, with its incarnation and ce.
    lp_rows = [r for r in rows if r["ce_raw"] is not None]
    assert [(r["incarnation"], r["step"]) for r in lp_rows] == [
        (t["incarnation"], t["step"]) for t in truth["loss_parts"]
    ]
    for t in truth["loss_parts"]:
        row = by_key[(t["incarnation"], t["step"])]
        if t["ce"] is None:
            assert row["ce"] is None and row["ce_raw"] == "nan"
        else:
            assert row["ce"] == pytest.approx(t["ce"], abs=1e-6)
        # The per-pod `completed step … loss:` is Tunix's loss, never the ce of record.
        assert row["parts"]["tunix_loss"] != row["ce"]

    rbf = {(t["incarnation"], t["step"]): t["max"] for t in truth["required_rbf"]}
    for key, row in by_key.items():
        if key in rbf:
            assert row["rbf_max"] == pytest.approx(rbf[key], abs=1e-4)
            assert len(row["rbf_per_layer"]) == 16
            assert max(row["rbf_per_layer"]) == pytest.approx(row["rbf_max"], abs=1e-4)
            assert row["rbf_program"] in ("first_phase", "normal")
        else:
            assert row["rbf_max"] is None and row["rbf_per_layer"] is None
    assert {k for k, r in by_key.items() if r["rbf_max"] is not None} == set(rbf)

    # Gaps of the truth are absent from what was recorded.
    recorded = {r["step"] for r in lp_rows}
    for first, last in truth["gaps"]:
        assert not recorded & set(range(first, last + 1))


def test_steps_json_fields_and_range(store, samples):
    url = store.engine.url.render_as_string(hide_password=False)
    run_cli("ingest", str(samples / "cp4-lb-nan.log"), "--run", "cp", "--db", url)
    code, out = run_cli("steps", "cp", "--db", url, "--json", "--from", "76", "--to", "78")
    rows = json.loads(out)
    assert [r["step"] for r in rows] == [76, 77, 78]
    nan_row = rows[1]
    assert nan_row["ce"] is None and nan_row["ce_raw"] == "nan"
    assert nan_row["parts"]["total"] == "nan"  # non-finite parts kept as words, JSON stays strict
    assert rows[0]["ts"] is None  # the sample has no kubelet timestamps
    assert set(rows[0]) >= {"incarnation", "step", "ts", "ce", "parts", "rbf_max", "rbf_per_layer", "rbf_program"}
    assert not any(isinstance(v, float) and math.isnan(v) for r in rows for v in r.values())

    code, out = run_cli("steps", "cp", "--db", url, "--csv", "--to", "2")
    lines = out.strip().splitlines()
    assert lines[0].startswith("incarnation,step,ts,ce") and len(lines) == 3


def test_runs_lists_ingested_runs(store, samples):
    url = store.engine.url.render_as_string(hide_password=False)
    run_cli("ingest", str(samples / "resume-gap.log"), "--run", "rg", "--db", url)
    code, out = run_cli("runs", "--db", url, "--json")
    (run,) = json.loads(out)
    assert run["run"] == "rg" and run["incarnations"] == 2 and run["steps"] == 426
    assert run["last_step"] == 400 and run["last_ts"].startswith("2026-11-30T05:26")
