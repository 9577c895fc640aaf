"""`--parquet DIR` back-fills from the store: after `ingest`, `follow` or `export` with --parquet
DIR, DIR holds every row SQL holds for the run exactly once — rows stored before DIR was named,
rows another path added out of key order, rows written live — and running it again writes
nothing. On SQLite and PostgreSQL, read back with pyarrow and pandas."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import sqlalchemy as sa
from test_store_failures import with_full_disk

from steptail.collector.live.parquet_feed import ParquetFeed
from steptail.collector.offline.files import open_source
from steptail.collector.offline.ingest import ingest
from steptail.runs.model import Batch
from steptail.storage.catchup import sql_rows
from steptail.storage.db import open_store
from steptail.storage.parquet import SCHEMAS, ParquetSink, read_table
from steptail.storage.row_keys import KEYS
from steptail.storage.sql import SqlSink

STEPTAIL = str(Path(sys.executable).parent / "steptail")


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"}
    return subprocess.run([STEPTAIL, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=120)


def _ingest(store, run, path, out=None):
    source = open_source(str(path))
    try:
        return ingest(store, run, [source], parquet=out)
    finally:
        source.close()


def _sql_keys(store, table, run) -> list[tuple]:
    cols = ", ".join(KEYS[table])
    with store.engine.connect() as conn:
        return sorted(tuple(r) for r in conn.execute(sa.text(f"SELECT {cols} FROM {table} WHERE run = :r"), {"r": run}))


def assert_exactly_sql(store, out, run) -> int:
    """Every row table of `run` in the dataset holds SQL's keys, each once; loss_parts' CE
    equal key by key. Returns the rows SQL holds."""
    total = 0
    for table in SCHEMAS:
        got = read_table(out, table, run)
        keys = sorted(zip(*(got.column(k).to_pylist() for k in KEYS[table]), strict=True))
        want = _sql_keys(store, table, run)
        assert keys == want, (table, len(keys), len(want))
        total += len(want)
    with store.engine.connect() as conn:
        ce = {(i, s): c for i, s, c in conn.execute(
            sa.text("SELECT incarnation, step, ce FROM loss_parts WHERE run = :r"), {"r": run})}
    got = read_table(out, "loss_parts", run).to_pydict()
    assert all(ce[(i, s)] == c or (ce[(i, s)] is None and c != c)
               for i, s, c in zip(got["incarnation"], got["step"], got["ce"], strict=True))
    return total


def test_ingest_parquet_of_a_stored_run_writes_its_rows_once(db_url, samples, tmp_path):
    """The README tour ingests clean-300 into SQL; docs/data.md then ingests it again with
    --parquet and reads `parquet/loss_parts` with pandas (it used to find no such folder)."""
    log = str(samples / "clean-300.log")
    assert cli("ingest", log, "--run", "clean-300", "--db", db_url, cwd=tmp_path).returncode == 0
    proc = cli("ingest", log, "--run", "clean-300", "--db", db_url, "--parquet", "parquet", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    store = open_store(db_url)
    try:
        stored = assert_exactly_sql(store, tmp_path / "parquet", "clean-300")
        assert json.loads(proc.stdout)["parquet"] == {"dir": "parquet", "rows_back_filled": stored, "error": None}
        snippet = 'import pandas as pd; print(len(pd.read_parquet("parquet/loss_parts")))'  # docs/data.md's
        read = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True)
        assert read.returncode == 0 and read.stdout.strip() == "300", read.stderr
        again = cli("ingest", log, "--run", "clean-300", "--db", db_url, "--parquet", "parquet", cwd=tmp_path)
        assert again.returncode == 0 and "parquet: parquet\n" in again.stdout, again.stdout
        assert assert_exactly_sql(store, tmp_path / "parquet", "clean-300") == stored
        assert len(pd.read_parquet(tmp_path / "parquet" / "loss_parts")) == 300
    finally:
        store.dispose()


def test_new_lines_into_a_stored_run_bring_the_older_rows_too(store, samples, tmp_path):
    """The first half of a log went to SQL only; the second half is ingested with --parquet:
    the dataset gets the first half from SQL, the second as it is read, no row twice."""
    lines = (samples / "resume-gap.log").read_text().splitlines(keepends=True)
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    first.write_text("".join(lines[: len(lines) // 2]))
    second.write_text("".join(lines[len(lines) // 2:]))
    _ingest(store, "rg", first)
    before = len(_sql_keys(store, "loss_parts", "rg"))
    result = _ingest(store, "rg", second, tmp_path / "pq")
    assert 0 < before < len(_sql_keys(store, "loss_parts", "rg")) == 426
    assert result.parquet_rows >= before and result.parquet_error is None
    assert assert_exactly_sql(store, tmp_path / "pq", "rg") > 426
    assert _ingest(store, "rg", second, tmp_path / "pq").parquet_rows == 0


def test_a_resumed_follow_writes_what_parquet_lacks_whatever_its_keys(store, samples, tmp_path):
    """follow --parquet resuming over a dataset that holds the run's later keys but not its
    earlier ones (written by an ingest of the later log, say): its start writes the earlier
    ones, the rows it then commits live are written once, and a restart writes nothing."""
    _ingest(store, "rg", samples / "resume-gap.log")
    out = tmp_path / "pq"
    sink = ParquetSink(out, "rg")
    for table in SCHEMAS:  # incarnation 2 only: past every key of incarnation 1
        later = [r for rows in sql_rows(store, table, "rg") for r in rows if r[1] == 2]
        sink.write(Batch(**{table: later}))
    sink.commit()
    assert 0 < read_table(out, "loss_parts", "rg").num_rows < 426

    failures = []
    feed = ParquetFeed(store, "rg", str(out), 0.0, lambda kind, why: failures.append(why))
    assert feed.catch_up() is None
    assert_exactly_sql(store, out, "rg")
    live = Batch(loss_parts=[("rg", 2, 401, 1_800_000_000_000_000_000, 1.25, "1.25", '{"z_loss":0.5}')])
    with store.engine.begin() as conn:  # what follow's RunSink commits, then hands to the feed
        assert not SqlSink(store).write(conn, "rg", live)
    feed.add(live)
    asyncio.run(feed.write())
    assert not failures and not feed.behind
    assert_exactly_sql(store, out, "rg")
    assert read_table(out, "loss_parts", "rg").num_rows == 427
    assert ParquetFeed(store, "rg", str(out), 0.0, failures.append).catch_up() is None  # restarted
    assert_exactly_sql(store, out, "rg")


def test_export_parquet_fills_and_compacts_a_run_stored_without_it(db_url, samples, tmp_path):
    store = open_store(db_url)
    try:
        _ingest(store, "rg", samples / "resume-gap.log")
        out = tmp_path / "pq"
        out.mkdir()
        for i in (1, 2):
            proc = cli("export", "rg", "--out", str(tmp_path / f"ledger{i}"), "--db", db_url, "--parquet", str(out),
                       "--json", cwd=tmp_path)
            assert proc.returncode == 0, proc.stderr
            stored = assert_exactly_sql(store, out, "rg")
            assert json.loads(proc.stdout)["parquet"]["rows_back_filled"] == (stored if i == 1 else 0)
            for table in SCHEMAS:  # compacted: one file per table
                assert len(list((out / table / "run=rg").glob("*.parquet"))) == 1
        assert len(pd.read_parquet(out / "loss_parts")) == 426
    finally:
        store.dispose()


def test_a_back_fill_that_fails_after_the_commit_warns_and_the_next_one_fills(tmp_path, samples):
    """The ingest committed; writing the older rows then fails (a full disk): a warning, exit
    0, no file half-written; the next ingest --parquet writes them."""
    db = f"sqlite:///{tmp_path / 's.db'}"
    log = str(samples / "clean-300.log")
    assert cli("ingest", log, "--run", "a", "--db", db, cwd=tmp_path).returncode == 0
    proc = with_full_disk("write_table", 0, "ingest", log, "--run", "a", "--db", db, "--parquet", "pq", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr.decode()
    assert "Parquet at pq lacks rows of run a stored before" in err and "No space left" in err, err
    assert not (tmp_path / "pq").exists()  # nothing to write but the older rows: no folder either
    assert cli("ingest", log, "--run", "a", "--db", db, "--parquet", "pq", cwd=tmp_path).returncode == 0
    store = open_store(db)
    try:
        assert assert_exactly_sql(store, tmp_path / "pq", "a") > 300
    finally:
        store.dispose()


def test_follow_parquet_of_a_run_followed_without_it_then_resumed(make_simcluster, tmp_path):
    """A run followed into SQL alone, then followed again with --parquet, twice (a resume over
    the same dataset): every stored row once, read back by pandas."""
    from test_follow_support import follow_sim, scenario

    sim = make_simcluster(scenario(rate=40))
    db, out = str(tmp_path / "f.db"), tmp_path / "pq"
    follow_sim(sim, db)
    assert not out.exists()
    store = open_store(db)
    try:
        for _ in range(2):
            follow_sim(sim, db, parquet=str(out))
            assert assert_exactly_sql(store, out, "r") > 160
        assert len(pd.read_parquet(out / "loss_parts")) == len(_sql_keys(store, "loss_parts", "r")) == 160
    finally:
        store.dispose()
