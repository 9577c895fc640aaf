"""Each sample log (tests/samples) yields exactly its findings, offline (check_run over the store, SQLite
and PostgreSQL) and through the incremental path (the run model's batches, fed to the engine
as `follow` does), with the same result however the rows are cut."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from findings_logs import feed_engine, keys, sample_lines

from steptail.cli import main
from steptail.runs.detectors import FindingEngine
from steptail.runs.model import Batch
from steptail.storage.findings import _incarnation_batches, check_run, load_findings, save_findings

EXPECTED = {
    "clean-300": set(),
    "resume-gap": {("gap", 1, 60, 63), ("missing_rbf", 1, 90, 91)},
    "resume-mismatch": {("resume_mismatch", 2, 101, 120)},
    "cp4-lb-nan": {("rule:load_balance", 1, -1, -1), ("nonfinite_ce", 1, 77, 77), ("step1_ce_gate", 1, 1, 1)},
    "resume-from-zero": {("resume_from_zero", 2, 1, 1)},
}


def cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return r.exit_code, r.output


def test_expected_agrees_with_truth(samples):
    """The table above is the samples' ground truth, not a transcript of the code's output."""
    for name, expected in EXPECTED.items():
        truth = json.loads((samples / f"{name}.truth.json").read_text())
        gaps = {(a, b) for a, b in truth["gaps"]}
        assert {(f, lo) for k, _, f, lo in expected if k == "gap"} == gaps
        kinds = {a["kind"] for a in truth["anomalies"]}
        assert kinds <= {k for k, *_ in expected}
        rbf = {(r["incarnation"], r["step"]) for r in truth["required_rbf"]}
        lp = {(r["incarnation"], r["step"]) for r in truth["loss_parts"]}
        no_rbf = sorted(s for i, s in lp - rbf)
        assert no_rbf == [s for k, _, f, last in expected if k == "missing_rbf" for s in range(f, last + 1)]


def _split(batch: Batch, size: int):
    """A stored incarnation's rows cut into windows of `size` steps, in log order."""
    steps = sorted({r[2] for r in batch.loss_parts} | {r[2] for r in batch.required_rbf})
    if not steps:
        yield batch
        return
    for i in range(0, len(steps), size):
        lo, hi = steps[i], steps[min(i + size, len(steps)) - 1]
        part = Batch(
            loss_parts=[r for r in batch.loss_parts if lo <= r[2] <= hi],
            required_rbf=[r for r in batch.required_rbf if lo <= r[2] <= hi],
        )
        if i == 0:
            part.config, part.checkpoints, part.incarnations = batch.config, batch.checkpoints, batch.incarnations
        yield part


@pytest.mark.parametrize("name", list(EXPECTED))
def test_sample_offline_and_incremental(name, store, samples):
    code, out = cli("ingest", str(samples / f"{name}.log"), "--run", name, "--db", store.engine.url.render_as_string(hide_password=False))
    assert code == 0, out

    offline = check_run(store, name)
    assert keys(offline) == EXPECTED[name]

    # (b) the stored rows cut into small batches, fed to one engine
    engine = FindingEngine(name)
    with store.engine.connect() as conn:
        for batch in _incarnation_batches(conn, name):
            for part in _split(batch, 3):
                engine.observe(part)
    engine.finish()
    assert keys(engine.findings.values()) == EXPECTED[name]

    # ingest stored them: saving the offline check's again writes nothing, each is held once
    with store.engine.begin() as conn:
        assert save_findings(conn, offline) == 0
    with store.engine.begin() as conn:
        assert save_findings(conn, check_run(store, name)) == 0
        assert keys(load_findings(conn, name)) == EXPECTED[name]


@pytest.mark.parametrize("name", list(EXPECTED))
@pytest.mark.parametrize("every", [1, 13, 400])
def test_sample_through_run_model_batches(name, every, samples):
    engine, outputs = feed_engine(name, sample_lines(samples / f"{name}.log"), every=every)
    assert keys(engine.findings.values()) == EXPECTED[name]
    # every finding handed out was opened exactly once (growth re-sends the same key only)
    opened = [f.key for out in outputs for f in out]
    assert set(opened) == set(engine.findings)


def test_named_details(samples):
    engine, _ = feed_engine("cp4", sample_lines(samples / "cp4-lb-nan.log"))
    by_kind = {f.kind: f for f in engine.findings.values()}
    gate = by_kind["step1_ce_gate"]
    assert "no HF reference" in gate.detail and "ici_context_parallelism=4" in gate.detail
    assert gate.severity == "warning"
    assert by_kind["nonfinite_ce"].severity == "critical" and "nan" in by_kind["nonfinite_ce"].detail
    engine, _ = feed_engine("rm", sample_lines(samples / "resume-mismatch.log"))
    (f,) = engine.findings.values()
    assert "0.050000" in f.detail and "restore from step 100" in f.detail


def test_gap_alerted_when_the_next_step_arrives(samples):
    engine, outputs = feed_engine("rg", sample_lines(samples / "resume-gap.log"), every=1, finish=False)
    lines = sample_lines(samples / "resume-gap.log")
    at = next(i for i, line in enumerate(lines) if b"LOSS-PARTS step=64 " in line)
    assert [f.kind for f in outputs[at]] == ["gap"]  # the batch of the line of step 64
    assert all(not out for out in outputs[:at])


def test_resume_tolerance_is_configurable(samples):
    from steptail.runs.detect import Settings

    engine, _ = feed_engine("rm", sample_lines(samples / "resume-mismatch.log"),
                            settings=Settings(resume_tolerance=0.06))
    assert keys(engine.findings.values()) == set()


@pytest.mark.parametrize("name", list(EXPECTED))
def test_check_cli(name, samples, tmp_path):
    db = str(tmp_path / "s.db")
    assert cli("ingest", str(samples / f"{name}.log"), "--run", name, "--db", db)[0] == 0
    for _ in range(2):  # re-checking never duplicates
        code, out = cli("check", name, "--db", db, "--json")
        data = json.loads(out)
        assert data["run"] == name
        assert {(f["kind"], f["incarnation"], f["first_step"], f["last_step"]) for f in data["findings"]} == EXPECTED[name]
        assert all(set(f) >= {"kind", "incarnation", "first_step", "last_step", "detail", "severity"}
                   for f in data["findings"])
        assert code == (1 if EXPECTED[name] else 0)
    eng = sa.create_engine(f"sqlite:///{db}")
    with eng.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM findings")).scalar() == len(EXPECTED[name])
    eng.dispose()
