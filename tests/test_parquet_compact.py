"""Parquet at rest: compaction keeps every row exactly (pandas, pyarrow, DuckDB read the same
before and after), leaves one file per run and table, is idempotent and survives a crash at
any step without counting a row twice; `parts` is a typed map; findings, stream gaps and
reconnects are tables of the dataset, equal to SQL."""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

import steptail.storage.compact as compact_mod
from steptail.collector.offline.files import open_source
from steptail.collector.offline.ingest import ingest
from steptail.runs.model import Batch
from steptail.storage.catchup import catch_up
from steptail.storage.compact import compact, recover, write_snapshots
from steptail.storage.parquet import JSON_PARTS_SCHEMA, SCHEMAS, ParquetSink, read_table
from steptail.storage.sql import COLUMNS

CLI = [sys.executable, "-c", "from steptail.cli import main; main()"]
TABLES = tuple(SCHEMAS)
JSON_COLUMNS = {"parts", "per_layer", "extra"}
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Killed(BaseException):
    """The process dies here: nothing after this point runs, no cleanup either."""


def _ingest(store, run, path, out=None):
    source = open_source(str(path))
    try:
        return ingest(store, run, [source], parquet=out)
    finally:
        source.close()


def _sql_rows(store, table, run):
    cols = COLUMNS[table]
    with store.engine.connect() as conn:
        found = conn.execute(sa.text(f"SELECT {', '.join(cols)} FROM {table} WHERE run = :r"
                                     f" ORDER BY {', '.join(cols[1:3])}"), {"r": run}).all()
    return [tuple(json.dumps(v, separators=(",", ":")) if c in JSON_COLUMNS and not isinstance(v, str | None)
                  else v for c, v in zip(cols, r, strict=True)) for r in found]


def _flush_in_parts(store, run, out, flushes):
    """Write the run's SQL rows to Parquet the way follow does: one file per flush and table."""
    rows = {t: _sql_rows(store, t, run) for t in TABLES}
    for i in range(flushes):
        sink = ParquetSink(out, run)
        sink.write(Batch(**{t: r[i * len(r) // flushes:(i + 1) * len(r) // flushes] for t, r in rows.items()}))
        sink.commit()


def _norm(v):
    """A value as the three readers give it, reduced to something comparable."""
    if isinstance(v, np.generic):
        v = v.item()
    if v is None or v is pd.NaT or isinstance(v, float) and math.isnan(v):
        return None  # pandas cannot tell a null float from nan
    if isinstance(v, datetime):  # pandas Timestamp or DuckDB datetime: microseconds, DuckDB's unit
        return (v - EPOCH) // timedelta(microseconds=1)
    if isinstance(v, dict):  # DuckDB maps
        return tuple(sorted((k, _norm(x)) for k, x in v.items()))
    if isinstance(v, list | tuple) or hasattr(v, "tolist"):
        items = [_norm(x) for x in (v.tolist() if hasattr(v, "tolist") else v)]
        if items and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in items):
            return tuple(sorted(items))  # map entries: order is not part of a map
        return tuple(items)
    return v


def _rows_pandas(out, table):
    frame = pd.read_parquet(Path(out) / table)
    frame["run"] = frame["run"].astype(str)
    return sorted((tuple(_norm(v) for v in r) for r in frame[sorted(frame.columns)].itertuples(index=False)), key=repr)


def _rows_duckdb(out, table):
    con = duckdb.connect()
    res = con.execute(f"SELECT * FROM read_parquet('{out}/{table}/*/*.parquet', hive_partitioning=1)")
    names = [d[0] for d in res.description]
    order = sorted(range(len(names)), key=lambda i: names[i])
    return sorted((tuple(_norm(r[i]) for i in order) for r in res.fetchall()), key=repr)


def _rows_dataset(out, table):
    return ds.dataset(Path(out) / table, format="parquet", partitioning="hive").to_table().num_rows


def _everything(out):
    return {t: (_rows_pandas(out, t), _rows_duckdb(out, t), _rows_dataset(out, t)) for t in TABLES}


def _files(out):
    return sorted(p.relative_to(out).as_posix() for p in Path(out).rglob("*") if p.is_file())


def _one_file_per_folder(out, tables=TABLES):
    for table in tables:
        for folder in (Path(out) / table).glob("run=*"):
            assert [p.name for p in folder.iterdir() if p.name.endswith(".parquet")] and \
                len(list(folder.iterdir())) == 1, (folder, list(folder.iterdir()))


@pytest.fixture
def parted(store, samples, tmp_path):
    """Two ingested runs whose Parquet was written in many small flushes (as follow does)."""
    out = tmp_path / "pq"
    _ingest(store, "rg", samples / "resume-gap.log")
    _ingest(store, "cp", samples / "cp4-lb-nan.log")
    _flush_in_parts(store, "rg", out, 7)
    _flush_in_parts(store, "cp", out, 3)
    return store, out


def test_compaction_keeps_every_row_and_leaves_one_file_per_run_and_table(parted):
    store, out = parted
    before = _everything(out)
    assert len(list((out / "loss_parts" / "run=rg").glob("*.parquet"))) == 7
    assert len(before["loss_parts"][0]) == 426 + 120
    done = compact(out)
    assert {(d.table, d.run) for d in done} == {(t, r) for t in TABLES for r in ("rg", "cp")}
    _one_file_per_folder(out)
    after = _everything(out)
    for t in TABLES:
        assert after[t] == before[t], t
        assert after[t][0] == after[t][1]  # pandas and DuckDB agree
    # and equal to SQL
    lp = read_table(out, "loss_parts", "rg").sort_by([("incarnation", "ascending"), ("step", "ascending")])
    assert [(r["incarnation"], r["step"], r["ce_raw"]) for r in lp.to_pylist()] == \
        [(r[1], r[2], r[5]) for r in _sql_rows(store, "loss_parts", "rg")]

    # idempotent: nothing rewritten, the same files
    files = _files(out)
    again = compact(out)
    assert not any(d.rewritten for d in again) and _files(out) == files
    assert _everything(out) == after


def test_row_groups_of_a_set_size(parted):
    _, out = parted
    compact(out, "rg", row_group_rows=100)
    (f,) = (out / "loss_parts" / "run=rg").glob("*.parquet")
    meta = pq.ParquetFile(f).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [100] * 4 + [26]


@pytest.mark.parametrize("step", ["ready", "hidden", "published"])
def test_a_crash_at_any_step_never_counts_a_row_twice(parted, monkeypatch, step):
    store, out = parted
    before = _everything(out)

    def crash(at):
        if at == step:
            raise Killed(at)

    monkeypatch.setattr(compact_mod, "_crash_point", crash)
    with pytest.raises(Killed):
        compact(out, "rg")
    monkeypatch.setattr(compact_mod, "_crash_point", lambda at: None)
    folder = out / "loss_parts" / "run=rg"
    hidden = sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
    visible = sorted(p.name for p in folder.glob("*.parquet"))
    if step == "ready":  # the old parts, and a finished file nobody reads yet
        assert len(visible) == 7 and len(hidden) == 1 and hidden[0].endswith(".ready")
        assert _everything(out) == before
    elif step == "hidden":  # parts hidden, new file not yet published: rows missing, none twice
        assert not visible and len(hidden) == 8
        assert len(_rows_duckdb(out, "loss_parts")) == 120
    else:  # new file published, replaced parts hidden and not yet removed
        assert len(visible) == 1 and len(hidden) == 7 and all(h.endswith(".replaced") for h in hidden)
        assert _everything(out) == before

    # catch_up (follow's start) finishes the swap first, so it finds nothing missing
    assert catch_up(store, "rg", out) == 0
    assert _everything(out) == before
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []
    compact(out)
    _one_file_per_folder(out)
    assert _everything(out) == before


def test_an_error_before_publishing_puts_the_parts_back(parted, monkeypatch):
    _, out = parted
    before, files = _everything(out), _files(out)

    def fail(at):
        if at == "hidden":
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(compact_mod, "_crash_point", fail)
    with pytest.raises(OSError, match="No space left"):
        compact(out, "rg")
    assert _files(out) == files and _everything(out) == before


def test_parts_written_while_compacting_are_kept(parted, monkeypatch):
    """A live follow flushes into the run while it is compacted: its part is not replaced."""
    store, out = parted
    extra = [("rg", 9, 10_000 + i, 1_900_000_000 * 10**9 + i, 1.5, "1.5", '{"z_loss":0.25}') for i in range(5)]

    flushed = []

    def live_flush(at):
        if at == "ready" and not flushed:  # while loss_parts (the first table) is compacted
            flushed.append(at)
            sink = ParquetSink(out, "rg")
            sink.write(Batch(loss_parts=extra))
            sink.commit()

    monkeypatch.setattr(compact_mod, "_crash_point", live_flush)
    compact(out, "rg")
    assert len(list((out / "loss_parts" / "run=rg").glob("*.parquet"))) == 2
    got = read_table(out, "loss_parts", "rg")
    assert got.num_rows == 426 + 5
    monkeypatch.setattr(compact_mod, "_crash_point", lambda at: None)
    compact(out, "rg")
    assert read_table(out, "loss_parts", "rg").num_rows == 426 + 5
    assert len(list((out / "loss_parts" / "run=rg").iterdir())) == 1


def test_parts_is_a_map_and_words_go_to_parts_text(store, tmp_path):
    log = tmp_path / "words.log"
    log.write_text(
        "I1130 04:00:12.167382 140233 train_sft.py:301] LOSS-PARTS step=1 ce=3.5 z_loss=1.25e-04 weights=1048576\n"
        "I1130 04:00:13.167382 140233 train_sft.py:301] LOSS-PARTS step=2 ce=3.4 z_loss=nan dtype=bf16\n"
        "I1130 04:00:14.167382 140233 train_sft.py:301] LOSS-PARTS step=3 ce=3.3\n")
    out = tmp_path / "pq"
    _ingest(store, "w", log, out)
    (f,) = (out / "loss_parts" / "run=w").glob("*.parquet")
    schema = pq.read_schema(f)
    assert schema.field("parts").type == pa.map_(pa.string(), pa.float64())
    assert schema.field("parts_text").type == pa.map_(pa.string(), pa.string())
    rows = read_table(out, "loss_parts", "w").sort_by("step").to_pylist()
    assert rows[0]["parts"] == [("z_loss", 1.25e-04), ("weights", 1048576.0)] and rows[0]["parts_text"] == []
    (name, value), = rows[1]["parts"]
    assert name == "z_loss" and math.isnan(value) and rows[1]["parts_text"] == [("dtype", "bf16")]
    assert rows[2]["parts"] == [] and rows[2]["parts_text"] == []
    # DuckDB reads the map as a map
    con = duckdb.connect()
    got = con.execute(f"SELECT step, parts['weights'], parts_text['dtype'] FROM read_parquet("
                      f"'{out}/loss_parts/*/*.parquet', hive_partitioning=1) ORDER BY step").fetchall()
    assert got == [(1, 1048576.0, None), (2, None, "bf16"), (3, None, None)]


def test_files_with_parts_as_json_text_still_read_and_compact_to_the_map(store, samples, tmp_path):
    """A dataset written before the map: read_table reads old and new files as one; compaction
    rewrites the old ones in the new schema, after which pandas and DuckDB read it whole."""
    out = tmp_path / "pq"
    _ingest(store, "rg", samples / "resume-gap.log")
    rows = _sql_rows(store, "loss_parts", "rg")
    folder = out / "loss_parts" / "run=rg"
    folder.mkdir(parents=True)
    half = len(rows) // 2
    old = pa.table({
        "incarnation": pa.array([r[1] for r in rows[:half]], pa.int32()),
        "step": pa.array([r[2] for r in rows[:half]], pa.int64()),
        "ts": pa.array([r[3] for r in rows[:half]], pa.int64()).cast(pa.timestamp("ns", tz="UTC")),
        "ce": [r[4] for r in rows[:half]], "ce_raw": [r[5] for r in rows[:half]],
        "parts": [r[6] for r in rows[:half]],
    }, schema=JSON_PARTS_SCHEMA)
    pq.write_table(old, folder / "part-20250101T000000-00000000.parquet", compression="zstd")
    sink = ParquetSink(out, "rg")
    sink.write(Batch(loss_parts=rows[half:]))
    sink.commit()

    mixed = read_table(out, "loss_parts", "rg").sort_by([("incarnation", "ascending"), ("step", "ascending")])
    assert mixed.schema.field("parts").type == SCHEMAS["loss_parts"].field("parts").type
    assert [dict(r["parts"]) for r in mixed.to_pylist()] == \
        [{k: float(v) for k, v in json.loads(r[6]).items()} for r in rows]
    compact(out)
    (f,) = folder.glob("*.parquet")
    assert pq.read_schema(f).remove_metadata() == SCHEMAS["loss_parts"]
    assert read_table(out, "loss_parts", "rg").sort_by(
        [("incarnation", "ascending"), ("step", "ascending")]).to_pylist() == mixed.to_pylist()
    assert len(pd.read_parquet(out / "loss_parts")) == len(rows) == len(_rows_duckdb(out, "loss_parts"))


def _seed_side_tables(store, run):
    ns = 1_800_000_000 * 10**9
    with store.engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO findings (run, kind, incarnation, first_step, last_step, detail, severity, detected_ns)"
            " VALUES (:r, 'stall', 1, 70, 70, 'no step for 600 s', 'warning', :t)"
            " ON CONFLICT DO NOTHING"), {"r": run, "t": ns})
        conn.execute(sa.text(
            "INSERT INTO stream_gaps (run, stream, start_ns, end_ns, reason, detected_ns) VALUES"
            " (:r, 'pod-0', :a, :b, 'log rotated', :t), (:r, 'pod-0', :c, NULL, 'unread_tail', :t)"),
            {"r": run, "a": ns - 50, "b": ns - 10, "c": ns + 5, "t": ns})
        conn.execute(sa.text(
            "INSERT INTO stream_reconnects (run, stream, ts_ns, reason) VALUES (:r, 'pod-0', :a, 'silence'),"
            " (:r, 'pod-0', :b, 'eof')"), {"r": run, "a": ns - 20, "b": ns - 5})


def _side_tables_match_sql(store, out, run):
    with store.engine.connect() as conn:
        findings = sorted(tuple(r) for r in conn.execute(sa.text(
            "SELECT kind, incarnation, first_step, last_step, detail, severity, detected_ns FROM findings"
            " WHERE run = :r"), {"r": run}))
        gaps = sorted(tuple(r) for r in conn.execute(sa.text(
            "SELECT stream, start_ns, end_ns, reason, detected_ns FROM stream_gaps WHERE run = :r"), {"r": run}))
        reconnects = sorted(tuple(r) for r in conn.execute(sa.text(
            "SELECT stream, ts_ns, reason FROM stream_reconnects WHERE run = :r"), {"r": run}))

    def ns(v):
        return None if v is None else pd.Timestamp(v).value

    f = read_table(out, "findings", run).to_pylist()
    assert sorted((r["kind"], r["incarnation"], r["first_step"], r["last_step"], r["detail"], r["severity"],
                   ns(r["detected"])) for r in f) == findings
    g = read_table(out, "stream_gaps", run).to_pylist()
    assert sorted((r["stream"], ns(r["start_ts"]), ns(r["end_ts"]), r["reason"], ns(r["detected"])) for r in g) == gaps
    c = read_table(out, "stream_reconnects", run).to_pylist()
    assert sorted((r["stream"], ns(r["ts"]), r["reason"]) for r in c) == reconnects
    for table in ("findings", "stream_gaps", "stream_reconnects"):  # one file, readable by all three
        assert len(list((out / table / f"run={run}").glob("*.parquet"))) == 1
        assert len(pd.read_parquet(out / table)) == len(_rows_duckdb(out, table)) == _rows_dataset(out, table)
    return findings, gaps, reconnects


def test_findings_gaps_and_reconnects_are_tables_of_the_dataset(store, samples, tmp_path):
    out = tmp_path / "pq"
    _ingest(store, "rg", samples / "resume-gap.log", out)  # ingest writes them
    assert (out / "findings" / "run=rg").is_dir() and (out / "stream_gaps" / "run=rg").is_dir()
    _side_tables_match_sql(store, out, "rg")
    _seed_side_tables(store, "rg")
    assert catch_up(store, "rg", out) == 0  # catch_up writes them afresh
    _, gaps, reconnects = _side_tables_match_sql(store, out, "rg")
    assert len(gaps) == 2 and len(reconnects) == 2
    with store.engine.begin() as conn:  # a finding dropped in SQL goes from the dataset too
        conn.execute(sa.text("DELETE FROM findings WHERE run = 'rg' AND kind = 'stall'"))
    write_snapshots(store, "rg", out)
    assert "stall" not in read_table(out, "findings", "rg").column("kind").to_pylist()
    _side_tables_match_sql(store, out, "rg")
    compact(out)  # not compaction's business: left as they are
    _side_tables_match_sql(store, out, "rg")


def test_export_with_parquet_compacts_and_writes_the_run_tables(db_url, samples, tmp_path):
    from steptail.storage.db import open_store

    store = open_store(db_url)
    try:
        _ingest(store, "rg", samples / "resume-gap.log")
        out = tmp_path / "pq"
        _flush_in_parts(store, "rg", out, 4)
        _seed_side_tables(store, "rg")
        before = _everything(out)
        r = subprocess.run([*CLI, "export", "rg", "--out", str(tmp_path / "ledger"), "--db", db_url,
                            "--parquet", str(out)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        _one_file_per_folder(out)
        assert _everything(out) == before
        _side_tables_match_sql(store, out, "rg")
        r = subprocess.run([*CLI, "export", "rg", "--out", str(tmp_path / "l2"), "--db", db_url,
                            "--parquet", str(tmp_path / "missing")], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "missing" in r.stderr
        assert not (tmp_path / "l2").exists()
    finally:
        store.dispose()


def test_compact_cli(parted, tmp_path):
    _, out = parted
    before, parts = _everything(out), len(list(out.glob("*/*/*.parquet")))
    r = subprocess.run([*CLI, "compact", "--parquet", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert parts > 40 and r.stdout.strip() == f"2 runs: {parts} files -> 10 (10 tables rewritten)"
    _one_file_per_folder(out)
    assert _everything(out) == before
    r = subprocess.run([*CLI, "compact", "rg", "--parquet", str(out), "--json"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and not any(d["rewritten"] for d in json.loads(r.stdout))
    as_csv = subprocess.run([*CLI, "compact", "rg", "--parquet", str(out), "-o", "csv"], capture_output=True,
                            text=True, timeout=120)
    assert [row["table"] for row in csv.DictReader(io.StringIO(as_csv.stdout))] == \
        [d["table"] for d in json.loads(r.stdout)]
    for args, says in ((["--parquet", str(tmp_path / "nope")], "does not exist"),
                       (["other", "--parquet", str(out)], "no run 'other'"),
                       (["../x", "--parquet", str(out)], "not a safe identifier")):
        r = subprocess.run([*CLI, "compact", *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, r.stderr
    r = subprocess.run([*CLI, "compact", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "never counts a row twice" in r.stdout
    assert "compact" in subprocess.run([*CLI, "--help"], capture_output=True, text=True, timeout=120).stdout


def test_a_followed_run_is_compacted_at_the_end_with_the_same_rows(make_simcluster, tmp_path, monkeypatch):
    """follow --until-done: parts flushed every 2 s, then compacted when it stops; pandas and
    DuckDB read the same rows before (seen from inside the shutdown hook) and after."""
    from test_follow_support import follow_sim, scenario

    from steptail.collector.live.sink import RunSink

    db, out = str(tmp_path / "f.db"), tmp_path / "pq"
    seen = {}
    real = RunSink.compact_parquet

    def spy(self):
        seen["files"] = _files(out)
        seen["rows"] = _everything(out)
        real(self)

    monkeypatch.setattr(RunSink, "compact_parquet", spy)
    sim = make_simcluster(scenario({"action": "eof_streams", "at_step": 80}, rate=40))
    follow_sim(sim, db, parquet=str(out))
    assert len([f for f in seen["files"] if f.startswith("loss_parts/")]) >= 2
    _one_file_per_folder(out)
    assert _everything(out) == seen["rows"]
    from steptail.storage.db import open_store

    store = open_store(db)
    try:
        assert read_table(out, "loss_parts", "r").num_rows == len(_sql_rows(store, "loss_parts", "r")) > 100
        _, _, reconnects = _side_tables_match_sql(store, out, "r")
        assert reconnects  # the eof fault re-opened the streams
    finally:
        store.dispose()
    for folder in out.glob("*/run=r"):
        recover(folder)  # nothing left half-done
        assert not [p for p in folder.iterdir() if p.name.startswith(".")]
