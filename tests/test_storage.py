"""The store: schema from the migrations on both databases, URL handling, state reload."""

from __future__ import annotations

import sqlalchemy as sa
from store_fixtures import at_revision

from steptail.runs.model import RunModel
from steptail.storage.db import SCHEMA_HEAD, migration_head, open_store, resolve_url
from steptail.storage.sql import SqlSink, load_model

TABLES = {
    "runs", "incarnations", "loss_parts", "required_rbf", "pod_metrics", "config", "checkpoints",
    "ingest_stats", "cursors", "stream_gaps", "stream_reconnects", "findings", "alembic_version",
}


def test_schema_head_constant_matches_alembic():
    assert SCHEMA_HEAD == migration_head()


def test_migrations_build_the_schema(store):
    assert TABLES <= set(store.tables)
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == SCHEMA_HEAD
    pk = sa.inspect(store.engine).get_pk_constraint("loss_parts")["constrained_columns"]
    assert pk == ["run", "incarnation", "step"]  # reading a run by step
    if not store.is_sqlite:
        indexes = {ix["name"] for ix in sa.inspect(store.engine).get_indexes("loss_parts")}
        assert "ix_loss_parts_run_step" in indexes
        assert "ix_loss_parts_ts" not in indexes  # loss_summary's index serves "recent" (0009)
    summary = {ix["name"] for ix in sa.inspect(store.engine).get_indexes("loss_summary")}
    assert summary == {"ix_loss_summary_last_ts"}
    assert "ix_runs_updated" in {ix["name"] for ix in sa.inspect(store.engine).get_indexes("runs")}
    # Opening again is a no-op upgrade.
    again = open_store(store.engine.url.render_as_string(hide_password=False))
    assert set(again.tables) == set(store.tables)
    again.dispose()


def test_a_store_of_an_older_schema_is_upgraded_with_its_rows(db_url):
    """A database left at 0001 by an earlier release: opening it upgrades, rows kept."""
    with at_revision(db_url, "0001") as conn:
        conn.execute(sa.text("INSERT INTO runs (run, created_ns, updated_ns) VALUES ('old', 1, 1)"))
    store = open_store(db_url)
    try:
        assert "stream_reconnects" in store.tables
        with store.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == SCHEMA_HEAD
            assert conn.execute(sa.text("SELECT run FROM runs")).scalar() == "old"
    finally:
        store.dispose()


def test_resolve_url_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv("STEPTAIL_DB", raising=False)
    monkeypatch.chdir(tmp_path)
    assert resolve_url(None).database == str(tmp_path / "steptail.db")
    monkeypatch.setenv("STEPTAIL_DB", str(tmp_path / "x.db"))
    assert resolve_url(None).database == str(tmp_path / "x.db")
    assert resolve_url("postgresql://u@h/db").drivername == "postgresql+psycopg"


LINES = [
    b"2026-11-30T04:00:00Z I1130 max_utils.py:273] Attempting to initialize the jax distributed system...",
    b"2026-11-30T04:00:00.1Z I1130 max_utils.py:290] Jax distributed system initialized! process_index=0 process_count=32",
    b"2026-11-30T04:00:00.2Z I1130 pyconfig.py:584] Config param ici_context_parallelism: 4",
    b"2026-11-30T04:00:01Z I1130 train_sft.py:301] LOSS-PARTS step=1 ce=3.5 total=3.6",
    b"2026-11-30T04:00:01Z I1130 train.py:1333] REQUIRED_RBF step=1 max=1.5000 per_layer=[1.5000,1.0000] program=first_phase",
    b"2026-11-30T04:00:02Z I1130 train_sft.py:301] LOSS-PARTS step=2 ce=3.4 total=3.5",
]


def test_model_state_survives_a_reload(store):
    """A restarted reader resumes where the store left off: same incarnation, no repeats."""
    sink = SqlSink(store)
    model = RunModel("r")
    for line in LINES[:4]:
        model.feed(line)
    with store.engine.begin() as conn:
        sink.ensure_run(conn, "r")
        sink.write(conn, "r", model.take())
    with store.engine.begin() as conn:
        again = load_model(conn, "r")
    assert again.current.number == 1 and again.current.last_step == 1 and again.current.saw_start
    assert again.current.process_count == 32 and "ici_context_parallelism" in again.current.config
    for line in LINES:  # a reconnect re-reads everything: only the two new lines count
        again.feed(line)
    batch = again.take()
    assert [r[2] for r in batch.loss_parts] == [2] and [r[2] for r in batch.required_rbf] == [1]
    assert again.counters.duplicates == 4 and again.current.number == 1


def test_step_going_back_opens_an_incarnation():
    """Without a start-up line: once the next step goes on from it (tests/test_one_line_fork.py)."""
    model = RunModel("r")
    for line in LINES[3:]:
        model.feed(line)
    model.feed(b"2026-11-30T04:10:00Z LOSS-PARTS step=1 ce=3.4")
    assert [(r[1], r[2]) for r in model.take().loss_parts] == [(1, 1), (1, 2)]  # held
    model.feed(b"2026-11-30T04:10:01Z LOSS-PARTS step=2 ce=3.3")
    rows = model.take().loss_parts
    assert [(r[1], r[2]) for r in rows] == [(2, 1), (2, 2)]


def test_lines_sharing_a_timestamp_are_all_kept_once():
    model = RunModel("r")
    same = [b"2026-11-30T04:00:01Z LOSS-PARTS step=1 ce=3.5", b"2026-11-30T04:00:01Z REQUIRED_RBF step=1 max=1.5000 per_layer=[1.5000] program=normal"]
    for line in same + same + same[::-1]:
        model.feed(line)
    batch = model.take()
    assert len(batch.loss_parts) == 1 and len(batch.required_rbf) == 1
    assert model.counters.duplicates == 4


def test_concurrent_first_use_of_one_sqlite_file(tmp_path):
    """Several processes opening a new SQLite store at once: one builds the schema, none fails."""
    import subprocess
    import sys

    db = tmp_path / "race.db"
    code = "import sys; from steptail.storage.db import open_store; open_store(sys.argv[1]).dispose()"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(db)], stderr=subprocess.PIPE) for _ in range(6)]
    errors = [p.communicate(timeout=120)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, errors


def test_a_new_pod_after_a_resume_opens_an_incarnation(store):
    """A collector restarted (or a replica taking over) loads the run from the store; the
    first pod it reads is the restarted JobSet's, its start-up rotated away, its first step
    past the last one stored: another pod than the incarnation's is a new incarnation."""
    a, b = "aaaaaaaa-0000-0000-0000-000000000001/jax-tpu/0", "bbbbbbbb-0000-0000-0000-000000000002/jax-tpu/0"

    def loss(t: int, step: int) -> bytes:
        return f"2026-11-30T04:{t // 60:02d}:{t % 60:02d}Z I1130 train_sft.py:301] LOSS-PARTS step={step} ce=3.0".encode()

    sink, model = SqlSink(store), RunModel("r")
    model.pod = "pod-a"
    model.feed(LINES[0], a)
    for s in range(1, 95):
        model.feed(loss(s, s), a)
    with store.engine.begin() as conn:
        sink.ensure_run(conn, "r")
        sink.write(conn, "r", model.take())
    for pod, stream, incarnations in (("pod-a", a, {1}), ("pod-b", b, {2})):
        with store.engine.begin() as conn:
            again = load_model(conn, "r")
        assert again.current.pod == "pod-a"
        again.pod = pod  # the same pod read again continues its incarnation
        for s in range(101, 110):
            again.feed(loss(200 + s, s), stream)
        assert {r[1] for r in again.take().loss_parts} == incarnations, pod
