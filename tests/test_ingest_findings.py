"""`ingest` stores the findings of what it reads, in the same transaction as the rows, as `check`
would (SQLite and PostgreSQL): each sample's findings from ingest alone, none added by a
re-ingest, a later file extending them, `check` agreeing; and a source without a record line
is refused (nothing of it written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from findings_logs import keys
from test_findings_samples import EXPECTED

from steptail.cli import main
from steptail.storage.db import open_store
from steptail.storage.findings import check_run, load_findings

NO_RECORD_WARNING = "no record line"


def cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def stored(db_url: str, run: str) -> list:
    store = open_store(db_url)
    try:
        with store.engine.connect() as conn:
            return load_findings(conn, run)
    finally:
        store.dispose()


def count(db_url: str, sql: str, **params) -> int:
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(sql), params).scalar_one()
    finally:
        engine.dispose()


def covers_truth(findings, truth: dict) -> bool:
    """Every anomaly of the ground truth is a stored finding of its kind at its steps."""
    for anomaly in truth["anomalies"]:
        first = anomaly.get("first_step", anomaly.get("step"))
        last = anomaly.get("last_step", first)
        if not any(f.kind == anomaly["kind"] and f.first_step == first and f.last_step == last
                   for f in findings):
            return False
    return True


@pytest.mark.parametrize("name", list(EXPECTED))
def test_ingest_alone_stores_the_findings(name, db_url, samples):
    truth = json.loads((samples / f"{name}.truth.json").read_text())
    r = cli("ingest", str(samples / f"{name}.log"), "--run", name, "--db", db_url, "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    findings = stored(db_url, name)
    assert keys(findings) == EXPECTED[name]
    assert covers_truth(findings, truth)
    assert summary["findings"] == len(EXPECTED[name])
    assert sum(summary["findings_by_kind"].values()) == summary["findings"]
    assert summary["no_records"] == []

    # a re-ingest that adds nothing changes nothing: the same rows, detected_ns included
    r = cli("ingest", str(samples / f"{name}.log"), "--run", name, "--db", db_url, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["findings"] == len(EXPECTED[name])
    assert stored(db_url, name) == findings

    # check agrees with what ingest stored and duplicates nothing
    r = cli("check", name, "--db", db_url, "--json")
    assert r.exit_code == (1 if EXPECTED[name] else 0), r.output
    reported = {(f["kind"], f["incarnation"], f["first_step"], f["last_step"], f["detail"])
                for f in json.loads(r.stdout)["findings"]}
    assert reported == {(f.kind, f.incarnation, f.first_step, f.last_step, f.detail) for f in findings}
    assert count(db_url, "SELECT COUNT(*) FROM findings WHERE run = :run", run=name) == len(EXPECTED[name])


def test_text_summary_names_findings_by_kind(db_url, samples):
    r = cli("ingest", str(samples / "cp4-lb-nan.log"), "--run", "cp", "--db", db_url)
    assert r.exit_code == 0, r.output
    assert "findings: 3 (nonfinite_ce 1, rule:load_balance 1, step1_ce_gate 1;" in r.stdout


def test_next_days_log_extends_the_findings_as_check_would(db_url, samples, tmp_path):
    """The mismatch range is cut in two files: the second ingest grows the one finding."""
    lines = (samples / "resume-mismatch.log").read_bytes().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if b"LOSS-PARTS step=110 " in line and i > 1000) + 1
    day1, day2 = tmp_path / "day1.log", tmp_path / "day2.log"
    day1.write_bytes(b"".join(lines[:cut]))
    day2.write_bytes(b"".join(lines[cut:]))

    assert cli("ingest", str(day1), "--run", "rm", "--db", db_url).exit_code == 0
    assert keys(stored(db_url, "rm")) == {("resume_mismatch", 2, 101, 110)}
    assert cli("ingest", str(day2), "--run", "rm", "--db", db_url).exit_code == 0
    findings = stored(db_url, "rm")
    assert keys(findings) == EXPECTED["resume-mismatch"]
    store = open_store(db_url)
    try:
        assert [(f.key, f.last_step, f.detail) for f in check_run(store, "rm")] == \
            [(f.key, f.last_step, f.detail) for f in findings]
    finally:
        store.dispose()


def test_a_file_without_records_is_refused(db_url, samples, tmp_path):
    readme = samples.parent.parent / "README.md"
    pq = tmp_path / "pq"
    r = cli("ingest", str(readme), "--run", "readme", "--db", db_url, "--parquet", str(pq))
    assert r.exit_code == 1, r.output
    assert f"{readme}: {NO_RECORD_WARNING}" in r.stderr
    assert "nothing written" in r.stderr
    if db_url.startswith("sqlite:///"):  # the store it created is removed (issue 37: no store left behind)
        assert not Path(db_url.removeprefix("sqlite:///")).exists()
    else:
        for table in ("runs", "ingest_stats", "incarnations", "findings", "cursors"):
            assert count(db_url, f"SELECT COUNT(*) FROM {table}") == 0, table
    assert not pq.exists() or not any(p.is_file() for p in pq.rglob("*"))


def test_only_the_record_less_sources_are_refused(db_url, samples, tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    readme = samples.parent.parent / "README.md"
    r = cli("ingest", str(readme), str(samples / "resume-mismatch.log"), str(empty),
            "--run", "rm", "--db", db_url, "--json")
    assert r.exit_code == 0, r.output
    assert r.stderr.count(NO_RECORD_WARNING) == 2
    summary = json.loads(r.stdout)
    assert summary["no_records"] == [str(readme), str(empty)]
    assert summary["bad_lines"] == 0  # README's malformed-looking lines are not counted: it was not ingested
    assert keys(stored(db_url, "rm")) == EXPECTED["resume-mismatch"]
    assert count(db_url, "SELECT COUNT(*) FROM ingest_stats") == 1
