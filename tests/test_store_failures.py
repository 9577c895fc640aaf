"""When the store or the disk fails: ingest lands whole or leaves everything as it was, the
first-use migration is all-or-nothing, an unusable store is one line and exit 2, and `follow`
waits out a store outage (backoff, one warning each way, nothing lost, no stall) and reports
a Parquet failure as such."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from store_fixtures import PG_ADMIN

from steptail.collector.live.detect import Detectors
from steptail.collector.live.sink import RunSink
from steptail.parsers import format_ns
from steptail.runs.detect import Settings
from steptail.runs.model import RunModel
from steptail.simcluster.trainer import Trainer
from steptail.storage.db import SCHEMA_HEAD, StoreError, open_store
from steptail.storage.parquet import ParquetError, ParquetSink, read_table

STEPTAIL = str(Path(sys.executable).with_name("steptail"))

# Runs the real command line with pyarrow's writer failing as on a full disk: `write_table`
# or `close` (the footer) raises ENOSPC after `after` calls. Small batches keep the SQL and
# Parquet writer threads both busy when it happens.
FULL_DISK = """
import errno, sys
import pyarrow.parquet as pq
import steptail.collector.offline.ingest
steptail.collector.offline.ingest.FLUSH_ROWS, steptail.collector.offline.ingest.READ_BLOCK = 32, 16384
method, after = sys.argv[1], int(sys.argv[2])
calls = [0]
def failing(self, *args, **kwargs):
    calls[0] += 1
    if calls[0] <= after:
        return real(self, *args, **kwargs)
    if method == "close":
        real(self, *args, **kwargs)
    raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")
if method != "none":
    real = getattr(pq.ParquetWriter, method)
    setattr(pq.ParquetWriter, method, failing)
from steptail.cli import main
sys.argv = ["steptail", *sys.argv[3:]]
main()
"""


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"}


def steptail(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([STEPTAIL, *args], cwd=cwd, capture_output=True, env=_env(), timeout=120)


def with_full_disk(method: str, after: int, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", FULL_DISK, method, str(after), *args], cwd=cwd,
                          capture_output=True, env=_env(), timeout=120)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr.decode()[-2000:])
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("steptail: error: "), lines
    return lines[0]


def sql_state(url: str) -> dict[str, list]:
    """Every row of every table, in a stable order."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {t: sorted(map(repr, conn.execute(sa.text(f"SELECT * FROM {t}"))))
                    for t in sorted(sa.inspect(conn).get_table_names())}
    finally:
        engine.dispose()


def tree(root: Path) -> list[tuple[str, int]]:
    """Every path under root with its size (directories too): what a failure must not change."""
    if not root.exists():
        return []
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1) for p in root.rglob("*"))


# -- ingest: all or nothing across SQL and Parquet ------------------------------------------------

@pytest.mark.parametrize("method, after", [("write_table", 0), ("write_table", 6), ("close", 0), ("close", 2)])
def test_parquet_on_a_full_disk_leaves_sql_and_parquet_as_they_were(db_url, tmp_path, samples, method, after):
    url = db_url
    first = steptail("ingest", str(samples / "clean-300.log"), "--run", "a", "--db", url, "--parquet", "pq",
                     cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    sql_before, pq_before = sql_state(url), tree(tmp_path / "pq")

    for run in ("b", "a"):  # a new run (no runs row may stay behind) and the same run again
        proc = with_full_disk(method, after, "ingest", str(samples / "resume-gap.log"), "--run", run,
                              "--db", url, "--parquet", "pq", cwd=tmp_path)
        line = one_line_error(proc)
        assert "No space left on device" in line and "Parquet" in line and "nothing written" in line
        assert sql_state(url) == sql_before
        assert tree(tmp_path / "pq") == pq_before  # no temporary file, no new directory


def test_parquet_into_a_new_directory_that_fills_up_leaves_no_directory(tmp_path, samples):
    proc = with_full_disk("write_table", 3, "ingest", str(samples / "clean-300.log"), "--run", "a",
                          "--db", "s.db", "--parquet", "out/pq", cwd=tmp_path)
    assert "No space left on device" in one_line_error(proc)
    assert not (tmp_path / "out").exists()
    assert sql_state(f"sqlite:///{tmp_path / 's.db'}")["runs"] == []


def test_a_parquet_sink_raises_one_line_and_is_not_touched_after_a_write_error(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from steptail.runs.model import Batch

    calls = []

    def full(self, table, *args, **kwargs):
        calls.append(table)
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    sink = ParquetSink(tmp_path / "pq", "r")
    batch = Batch(config=[("r", 1, "steps", "10")])
    with pytest.raises(ParquetError, match=r"cannot write Parquet under .*pq: No space left on device"):
        sink.write(batch)
    with pytest.raises(ParquetError):
        sink.write(batch)  # pyarrow's writer is never used again after an I/O error
    assert len(calls) == 1
    sink.abort()
    sink.abort()  # twice is harmless
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def tiny_fs(tmp_path):
    """A real 64 KiB tmpfs (root only, where mounting is allowed); umounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_really_full_disk_under_parquet(tiny_fs, tmp_path, samples):
    """No injection: Parquet on a 64 KiB filesystem. Tried a few times, as the failure lands
    at a different point of the writer threads each time (it used to crash natively or keep
    orphan rows now and then)."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert steptail("ingest", str(samples / "clean-300.log"), "--run", "a", "--db", url, cwd=tmp_path).returncode == 0
    before = sql_state(url)
    for _ in range(3):
        proc = with_full_disk("none", 0, "ingest", str(samples / "resume-mismatch.log"), str(samples / "resume-gap.log"),
                              "--run", "b", "--db", url, "--parquet", str(tiny_fs / "pq"), cwd=tmp_path)
        assert "No space left on device" in one_line_error(proc)
        assert sql_state(url) == before
        assert list(tiny_fs.iterdir()) == []


def test_a_disk_full_during_the_first_migration_leaves_a_store_that_opens_later(tiny_fs, samples):
    """The first use of a store on a full disk fails (one line); once there is room it opens
    and upgrades (it used to say "table runs already exists" for ever)."""
    subprocess.run(["mount", "-o", "remount,size=512k", str(tiny_fs)], check=True)  # room for a few tables
    proc = steptail("ingest", str(samples / "clean-300.log"), "--run", "a", "--db", "s.db", cwd=tiny_fs)
    assert "database or disk is full" in one_line_error(proc)
    subprocess.run(["mount", "-o", "remount,size=16m", str(tiny_fs)], check=True)
    proc = steptail("ingest", str(samples / "clean-300.log"), "--run", "a", "--db", "s.db", "--json", cwd=tiny_fs)
    assert proc.returncode == 0, proc.stderr


# -- the first-use migration is one transaction ----------------------------------------------------

def test_a_migration_interrupted_half_way_leaves_a_store_that_opens_and_upgrades(db_url, monkeypatch):
    import alembic.op

    create_table = alembic.op.create_table

    def disk_full_in_0002(name, *args, **kwargs):
        table = create_table(name, *args, **kwargs)
        if name == "stream_reconnects":  # revision 0002, after 0001 ran whole
            raise sa.exc.OperationalError("CREATE TABLE", {}, sqlite3.OperationalError("database or disk is full"))
        return table

    monkeypatch.setattr(alembic.op, "create_table", disk_full_in_0002)
    with pytest.raises(StoreError, match="database or disk is full"):
        open_store(db_url)
    engine = sa.create_engine(db_url)
    assert sa.inspect(engine).get_table_names() == []  # all of it rolled back
    engine.dispose()

    monkeypatch.setattr(alembic.op, "create_table", create_table)
    store = open_store(db_url)
    try:
        assert {"runs", "stream_reconnects", "run_sources"} <= set(store.tables)
        with store.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == SCHEMA_HEAD
    finally:
        store.dispose()


# -- an unusable store: one line, exit 2, on every command that opens it ---------------------------

COMMANDS = [["ingest", "{sample}", "--run", "r"], ["runs"], ["check", "r"]]


@pytest.fixture
def read_only_dir(tmp_path, samples):
    """A directory holding a store, made read-only: a read-only mount as root (root writes
    through permission bits), else chmod."""
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = os.geteuid() == 0
    if mounted and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(ro)],
                                  capture_output=True).returncode != 0:
        pytest.skip("root, and cannot mount a read-only filesystem here")
    try:
        proc = steptail("ingest", str(samples / "clean-300.log"), "--run", "r", "--db", str(ro / "s.db"), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        if mounted:
            subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        else:
            ro.chmod(0o555)
        yield ro
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(ro)], capture_output=True)
        else:
            ro.chmod(0o755)


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
@pytest.mark.parametrize("name", ["s.db", "new.db"])
def test_a_read_only_directory_is_one_line(read_only_dir, tmp_path, samples, args, name):
    args = [a.replace("{sample}", str(samples / "clean-300.log")) for a in args]
    proc = steptail(*args, "--db", str(read_only_dir / name), cwd=tmp_path)
    if name == "new.db" and args[0] != "ingest":
        assert "no database at" in one_line_error(proc)
        return
    line = one_line_error(proc)
    reasons = ("read-only", "readonly", "permission denied", "unable to open")
    assert str(read_only_dir) in line and any(r in line.lower() for r in reasons), line


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
def test_a_file_that_is_not_a_database_is_one_line(tmp_path, samples, args):
    (tmp_path / "s.db").write_bytes(b"not a database\n" + bytes(range(256)) * 64)
    args = [a.replace("{sample}", str(samples / "clean-300.log")) for a in args]
    line = one_line_error(steptail(*args, "--db", "s.db", cwd=tmp_path))
    assert "file is not a database" in line


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
def test_an_unreachable_server_is_one_line(tmp_path, samples, args):
    args = [a.replace("{sample}", str(samples / "clean-300.log")) for a in args]
    line = one_line_error(steptail(*args, "--db", "postgresql://u:hunter2@127.0.0.1:1/x", cwd=tmp_path))
    assert "cannot use database" in line and "hunter2" not in line


def test_a_database_damaged_inside_is_one_line(tmp_path, samples):
    """Opens fine, fails on a damaged page while the command reads."""
    assert steptail("ingest", str(samples / "clean-300.log"), "--run", "r", "--db", "s.db", cwd=tmp_path).returncode == 0
    db = tmp_path / "s.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything in the main file, where the damage goes
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'loss_parts'").fetchone()[0]
    conn.close()
    with open(db, "r+b") as f:  # the first page of loss_parts, which `runs` reads
        f.seek((root - 1) * page_size)
        f.write(b"\xff" * page_size)
    line = one_line_error(steptail("runs", "--db", "s.db", cwd=tmp_path))
    assert "malformed" in line


# -- follow: a store outage, a Parquet failure ------------------------------------------------------

STEP_S = 0.15  # the simulated trainer's step time


class Outage:
    """Makes the store refuse writes. SQLite: a failing connection (every statement raises);
    PostgreSQL: the database stops accepting connections and its sessions are ended."""

    def __init__(self, store, url: str) -> None:
        self.store, self.url, self.down = store, url, False
        if store.is_sqlite:
            sa.event.listen(store.engine, "before_cursor_execute", self._refuse)

    def _refuse(self, conn, cursor, statement, *args) -> None:
        if self.down:
            raise sa.exc.OperationalError(statement, None, sqlite3.OperationalError("disk I/O error"))

    def set(self, down: bool) -> None:
        self.down = down
        if self.store.is_sqlite:
            return
        name = sa.make_url(self.url).database
        admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {"false" if down else "true"}'))
            if down:
                conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"),
                             {"d": name})
        admin.dispose()


async def follow_with_outage(sink: RunSink, model: RunModel, outage: Outage | None, seconds: float,
                             down: tuple[float, float], flush_every: float = 0.05) -> int:
    """Feed a trainer's lines (stamped now) and flush like the follower does; the store is down
    during `down` (seconds from the start). Returns the last step fed."""
    trainer = Trainer(steps=10**6, step_seconds=STEP_S)
    for line in trainer.startup_lines(at=datetime.now(UTC)):
        model.feed(f"{format_ns(time.time_ns())} {line}".encode())
    t0, step, next_step, state = time.monotonic(), 0, 0.0, False
    while (now := time.monotonic() - t0) < seconds:
        if now >= next_step:
            step += 1
            next_step += STEP_S
            for line in trainer.step_lines(step, at=datetime.now(UTC), record=False):
                model.feed(f"{format_ns(time.time_ns())} {line}".encode())
        want = down[0] <= now < down[1]
        if outage is not None and want != state:
            await asyncio.to_thread(outage.set, want)
            state = want
        await sink.flush(model)
        await asyncio.sleep(flush_every)
    if outage is not None and state:
        await asyncio.to_thread(outage.set, False)
    while sink.pending or sink.error:  # what is still waiting goes at the next retry
        await asyncio.sleep(0.1)
        await sink.flush(model)
    return step


async def test_a_store_outage_is_waited_out_with_backoff_and_nothing_lost(db_url, caplog):
    caplog.set_level(logging.INFO)
    store = open_store(db_url)
    try:
        det = Detectors("r", store, settings=Settings(stall_k=5.0, stall_min_seconds=0))  # a stall: 0.75 s without a step
        sink = RunSink(store, "r", None, det)
        outage = Outage(store, db_url)
        last = await follow_with_outage(sink, RunModel("r"), outage, seconds=5.0, down=(1.5, 3.5))

        failing = [r for r in caplog.records if "store failing" in r.getMessage()]
        back = [r for r in caplog.records if "store ok again" in r.getMessage()]
        assert len(failing) == 1 and failing[0].levelno == logging.WARNING, [r.getMessage() for r in caplog.records]
        assert "store write failed" in failing[0].getMessage()
        assert len(back) == 1
        # 2 s down: retried after 0.2, 0.4, 0.8, 1.6 s... not at every 50 ms flush (40 times)
        assert sink.health.counts["store"] <= 8, sink.health.counts
        with store.engine.connect() as conn:
            steps = conn.execute(sa.text("SELECT COUNT(*), MIN(step), MAX(step) FROM loss_parts")).one()
            stored = [k for (k,) in conn.execute(sa.text("SELECT kind FROM findings"))]
        assert tuple(steps) == (last, 1, last)
        assert "stall" not in [f.kind for f in det.flagged] and "stall" not in stored
    finally:
        store.dispose()


async def test_a_parquet_failure_is_a_parquet_failure_and_catches_up(store, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    from steptail.collector.notify.collector_events import CollectorEvents
    from steptail.storage.collector_events import read_events

    book = CollectorEvents()
    det = Detectors("r", store, collector_events=book)
    sink = RunSink(store, "r", str(tmp_path / "pq"), det, parquet_every=0.0)
    model = RunModel("r")
    real_write = ParquetSink.write_table  # what live writes and the catch-up's back-fill both go through

    def full(self, table, data):
        raise ParquetError(f"cannot write Parquet under {self.root}: No space left on device")

    monkeypatch.setattr(ParquetSink, "write_table", full)
    await follow_with_outage(sink, model, None, seconds=1.0, down=(0, 0))
    monkeypatch.setattr(ParquetSink, "write_table", real_write)
    await follow_with_outage(sink, model, None, seconds=0.6, down=(0, 0))
    await sink.flush(model, parquet=True)

    # the collector's fault, not the run's (SQL has every row): a collector event, no finding
    kinds = [f.kind for f in det.flagged]
    assert "parquet_failure" not in kinds and "stream_failure" not in kinds, kinds
    (event,) = book.events
    assert event.kind == "parquet_failure" and event.source == "parquet" and not event.open, event
    assert "No space left on device" in event.reason and not event.lost_steps
    assert book.save(store) == 1
    with store.engine.connect() as conn:
        (stored,) = read_events(conn, "r")
    assert stored["kind"] == "parquet_failure" and stored["cleared"] and "No space left" in stored["reason"]
    failing = [r for r in caplog.records if "parquet failing" in r.getMessage()]
    assert len(failing) == 1 and failing[0].levelno == logging.WARNING
    assert any("parquet ok again" in r.getMessage() for r in caplog.records)
    with store.engine.connect() as conn:
        in_sql = conn.execute(sa.text("SELECT COUNT(*) FROM loss_parts")).scalar()
    assert in_sql > 0 and read_table(tmp_path / "pq", "loss_parts", "r").num_rows == in_sql
