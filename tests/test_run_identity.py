"""Run identity: a run records its source (a followed JobSet or ingested files), and follow or
ingest into a run of another source is refused unless --append says it is the same run.

Issue 9: `follow --all` appended a live JobSet to an earlier file-ingested run of the same
name, which became incarnation 2 and raised false resume alerts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import sqlalchemy as sa
from test_follow_support import FAST, assert_exactly_once, rows

from steptail.storage.db import SCHEMA_HEAD, open_store
from steptail.storage.sources import FILES, SourceConflict, check_runs, kubernetes_source
from steptail.storage.sql import SqlSink

pytestmark = pytest.mark.timeout(120)
CLI = [sys.executable, "-c", "from steptail.cli import main; main()"]
OLMO = kubernetes_source("default", "olmo3-sft")
TRAINER = {"hosts": 2, "trainer": {"steps": 160, "checkpoint_period": 50}}
# What a refused command must leave alone, per table (the run's own rows).
TABLES = ("loss_parts", "required_rbf", "pod_metrics", "incarnations", "config", "checkpoints", "cursors",
          "stream_gaps", "stream_reconnects", "findings", "ingest_stats", "run_sources")


def steptail(*args: str, account: str | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("STEPTAIL_DB", "CLOUDSDK_CORE_ACCOUNT")}
    if account:
        env["CLOUDSDK_CORE_ACCOUNT"] = account
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=timeout)


def follow(sim, db: str, *extra: str) -> subprocess.CompletedProcess:
    return steptail("follow", "-n", "default", "--kubeconfig", str(sim.kubeconfig_path), "--db", db,
                    "--silence", "1", "--no-view", "--until-done", "--json", *extra, account=sim.account)


def ingest(db: str, run: str, path, *extra: str) -> subprocess.CompletedProcess:
    return steptail("ingest", str(path), "--run", run, "--db", db, "--json", *extra)


def refusal(proc: subprocess.CompletedProcess) -> str:
    """The one error line of a refused command (exit 2)."""
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("steptail: error: "), lines
    return lines[0]


def state(db: str, run: str) -> dict:
    """Everything stored about one run: row counts per table and the runs row itself."""
    out = {t: rows(db, f"SELECT COUNT(*) FROM {t} WHERE run = :r", run)[0][0] for t in TABLES}
    out["runs"] = rows(db, "SELECT jobset, namespace, created_ns, updated_ns FROM runs WHERE run = :r", run)
    return out


def sources(db: str, run: str) -> list[str]:
    return sorted(r[0] for r in rows(db, "SELECT source FROM run_sources WHERE run = :r", run))


def test_follow_into_a_file_ingested_run_needs_append(make_simcluster, db_url, samples):
    sim = make_simcluster({**FAST, "jobsets": [{"name": "olmo3-sft", **TRAINER}]})
    assert ingest(db_url, "olmo3-sft", samples / "clean-300.log").returncode == 0
    before = state(db_url, "olmo3-sft")
    assert sources(db_url, "olmo3-sft") == [FILES]

    line = refusal(follow(sim, db_url, "--jobset", "olmo3-sft"))
    assert line == (f'steptail: error: run "olmo3-sft" holds data ingested from files; following {OLMO} '
                    "would append to it: pass --append if it is the same run, or --run NAME")
    assert state(db_url, "olmo3-sft") == before  # nothing written, not even the runs row touched

    done = follow(sim, db_url, "--jobset", "olmo3-sft", "--append")
    assert done.returncode == 0, done.stderr
    assert [r["state"] for r in json.loads(done.stdout)["runs"]] == ["done"]
    assert sources(db_url, "olmo3-sft") == sorted([FILES, OLMO])
    by_inc = dict(rows(db_url, "SELECT incarnation, COUNT(*) FROM loss_parts WHERE run = :r GROUP BY 1",
                       "olmo3-sft"))
    assert by_inc == {1: 300, 2: 160}  # the files' 300 steps, then the live JobSet's 160

    # Following the same JobSet again is no conflict: nothing to refuse, nothing repeated.
    again = follow(sim, db_url, "--jobset", "olmo3-sft")
    assert again.returncode == 0, again.stderr
    assert state(db_url, "olmo3-sft")["loss_parts"] == 460


def test_follow_all_refuses_only_the_clashing_run(make_simcluster, db_url, samples, tmp_path):
    sim = make_simcluster({**FAST, "jobsets": [{"name": "olmo3-sft", **TRAINER}, {"name": "qwen3-cp4", **TRAINER}]})
    assert ingest(db_url, "olmo3-sft", samples / "clean-300.log").returncode == 0
    before = state(db_url, "olmo3-sft")

    proc = follow(sim, db_url, "--all")
    assert proc.returncode == 0, proc.stderr
    status = {r["run"]: r for r in json.loads(proc.stdout)["runs"]}
    assert status["qwen3-cp4"]["state"] == "done" and status["qwen3-cp4"]["rows"] > 0
    refused = status["olmo3-sft"]
    assert refused["state"] == "refused: holds data ingested from files"
    assert f'run "olmo3-sft" holds data ingested from files; following {OLMO} would append' \
        in refused["last_error"]
    logged = [ln for ln in proc.stderr.splitlines() if "would append" in ln]
    assert len(logged) == 1 and " ERROR steptail.follow " in logged[0], proc.stderr
    assert state(db_url, "olmo3-sft") == before
    r = assert_exactly_once(sim, db_url, "qwen3-cp4", "qwen3-cp4")
    assert len(r["got"]) == 160
    assert sources(db_url, "qwen3-cp4") == [kubernetes_source("default", "qwen3-cp4")]

    # Saved logs into the followed run: refused (SQL and Parquet untouched) unless --append.
    followed = state(db_url, "qwen3-cp4")
    pq = tmp_path / "pq"
    line = refusal(ingest(db_url, "qwen3-cp4", samples / "clean-300.log", "--parquet", str(pq)))
    assert line == ('steptail: error: run "qwen3-cp4" holds data followed from kubernetes:default/qwen3-cp4; '
                    "ingesting files would append to it: pass --append if it is the same run, or --run NAME")
    assert state(db_url, "qwen3-cp4") == followed
    assert not list(pq.rglob("*.parquet*"))
    appended = ingest(db_url, "qwen3-cp4", samples / "clean-300.log", "--append")
    assert appended.returncode == 0, appended.stderr
    assert json.loads(appended.stdout)["loss_parts"] == 300
    assert sources(db_url, "qwen3-cp4") == sorted([FILES, kubernetes_source("default", "qwen3-cp4")])


def test_reingesting_files_into_a_files_run_still_works(db_url, samples):
    first = ingest(db_url, "rg", samples / "resume-gap.log")
    assert first.returncode == 0, first.stderr
    stored = state(db_url, "rg")
    again = ingest(db_url, "rg", samples / "resume-gap.log")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["loss_parts"] == 0
    after = state(db_url, "rg")
    assert after["loss_parts"] == stored["loss_parts"] == 426 and after["incarnations"] == 2
    assert sources(db_url, "rg") == [FILES]
    listed = json.loads(steptail("runs", "--db", db_url, "--json").stdout)
    assert [(r["run"], r["sources"]) for r in listed] == [("rg", [FILES])]


def test_two_jobsets_under_one_run_name_clash(store):
    """`--run NAME` given to a second JobSet: the run is the first JobSet's."""
    sink, other = SqlSink(store), kubernetes_source("team-b", "olmo3-sft")
    with store.engine.begin() as conn:
        sink.ensure_run(conn, "olmo3-sft", "olmo3-sft", "default", source=OLMO)
    check_runs(store, {"olmo3-sft": OLMO, "new-run": other})  # the same JobSet, a new run: fine
    with pytest.raises(SourceConflict) as err:
        check_runs(store, {"olmo3-sft": other})
    assert err.value.clash == (f'run "olmo3-sft" holds data followed from {OLMO}; following {other} '
                               "would append to it")
    with pytest.raises(SourceConflict), store.engine.begin() as conn:
        sink.ensure_run(conn, "olmo3-sft", "olmo3-sft", "team-b", source=other)
    with store.engine.connect() as conn:  # the refused claim rolled back with its transaction
        assert conn.execute(sa.text("SELECT namespace FROM runs")).scalar() == "default"


def test_a_store_at_0002_is_upgraded_and_its_runs_get_their_sources(db_url):
    """A store of the previous release: opening it adds run_sources, keeps every row, and
    derives each run's source from what its rows show."""
    from alembic import command
    from alembic.config import Config

    from steptail.storage.db import MIGRATIONS, _engine

    engine = _engine(sa.make_url(db_url))
    with engine.begin() as conn:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0002")
        conn.execute(sa.text(
            "INSERT INTO runs (run, jobset, namespace, created_ns, updated_ns) VALUES"
            " ('followed', 'olmo3-sft', 'default', 1, 2), ('ingested', NULL, NULL, 3, 4),"
            " ('empty', NULL, NULL, 5, 6)"))
        conn.execute(sa.text(
            "INSERT INTO ingest_stats (run, source, started_ns, finished_ns, lines, loss_parts, required_rbf,"
            " pod_steps, bad_lines, duplicates, bad_samples) VALUES"
            " ('ingested', 'a.log', 3, 4, 10, 1, 0, 0, 0, 0, '[]')"))
        conn.execute(sa.text(
            "INSERT INTO loss_parts (run, incarnation, step, ts_ns, ce, ce_raw, parts) VALUES"
            " ('followed', 1, 1, 7, 3.5, '3.5', '{}'), ('ingested', 1, 1, 8, 3.4, '3.4', '{}')"))
    engine.dispose()

    store = open_store(db_url)
    try:
        assert "run_sources" in store.tables
        with store.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == SCHEMA_HEAD
            assert conn.execute(sa.text("SELECT run, created_ns, updated_ns FROM runs ORDER BY run")).all() \
                == [("empty", 5, 6), ("followed", 1, 2), ("ingested", 3, 4)]
            assert conn.execute(sa.text("SELECT run, step, ce FROM loss_parts ORDER BY run")).all() \
                == [("followed", 1, 3.5), ("ingested", 1, 3.4)]
            assert conn.execute(sa.text("SELECT run, source, added_ns FROM run_sources ORDER BY run")).all() \
                == [("followed", OLMO, 1), ("ingested", FILES, 3)]
        # the old runs are guarded like new ones; a run with no known source is anyone's
        with pytest.raises(SourceConflict, match="holds data ingested from files"):
            check_runs(store, {"ingested": OLMO})
        with pytest.raises(SourceConflict, match=f"holds data followed from {OLMO}"):
            check_runs(store, {"followed": FILES})
        check_runs(store, {"empty": OLMO, "followed": OLMO, "ingested": FILES})
    finally:
        store.dispose()
