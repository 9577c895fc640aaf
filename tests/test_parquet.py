"""Parquet files: hive-partitioned, declared schemas, read back equal to the SQL rows."""

from __future__ import annotations

import json
import math

import duckdb
import pandas as pd
import pyarrow.parquet as pq
import sqlalchemy as sa

from steptail.collector.offline.files import open_source
from steptail.collector.offline.ingest import ingest
from steptail.storage.parquet import dataset_schema, read_table


def _ingest(store, run, path, out):
    source = open_source(str(path))
    try:
        return ingest(store, run, [source], parquet=out)
    finally:
        source.close()


def _norm(v):
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def test_parquet_equals_sql(store, samples, tmp_path):
    out = tmp_path / "pq"
    _ingest(store, "rg", samples / "resume-gap.log", out)
    _ingest(store, "cp", samples / "cp4-lb-nan.log", out)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.parquet"))
    assert all(f.split("/")[1] in ("run=rg", "run=cp") for f in files)
    assert not list(out.rglob("*.tmp"))
    for f in out.rglob("*.parquet"):
        table = f.parts[-3]
        assert pq.read_schema(f).remove_metadata() == dataset_schema(table)
        if pq.ParquetFile(f).metadata.num_row_groups:  # findings etc. of a run without any: no rows
            assert pq.ParquetFile(f).metadata.row_group(0).column(0).compression == "ZSTD"

    with store.engine.connect() as conn:
        for run in ("rg", "cp"):
            sql = conn.execute(sa.text(
                "SELECT incarnation, step, ts_ns, ce, ce_raw, parts FROM loss_parts WHERE run = :r"
                " ORDER BY incarnation, step"), {"r": run}).all()
            got = read_table(out, "loss_parts", run).sort_by([("incarnation", "ascending"), ("step", "ascending")])
            rows = got.to_pylist()
            assert len(rows) == len(sql)
            for p, s in zip(rows, sql, strict=True):
                ts = None if p["ts"] is None else int(pd.Timestamp(p["ts"]).value)
                assert (p["incarnation"], p["step"], ts, _norm(p["ce"]), p["ce_raw"]) == tuple(s[:5])
                parts = s.parts if isinstance(s.parts, dict) else json.loads(s.parts)
                # typed map since the JSON column: numbers (nan/inf words as floats) in `parts`
                got_parts = {k: _norm(v) for k, v in p["parts"]} | dict(p["parts_text"])
                assert got_parts == {k: None if v == "nan" else float(v) if v in ("inf", "-inf") else v
                                     for k, v in parts.items()}

            rbf_sql = conn.execute(sa.text(
                "SELECT incarnation, step, max, per_layer, program FROM required_rbf WHERE run = :r"
                " ORDER BY incarnation, step"), {"r": run}).all()
            rbf = read_table(out, "required_rbf", run).sort_by(
                [("incarnation", "ascending"), ("step", "ascending")]).to_pylist()
            assert [(r["incarnation"], r["step"], r["max"], r["per_layer"], r["program"]) for r in rbf] == [
                (a, b, c, d if isinstance(d, list) else json.loads(d), e) for a, b, c, d, e in rbf_sql
            ]
            n_pod = conn.execute(sa.text("SELECT COUNT(*) FROM pod_metrics WHERE run = :r"), {"r": run}).scalar()
            assert read_table(out, "pod_metrics", run).num_rows == n_pod

    # The whole dataset reads with its partition column, in pandas, pyarrow and DuckDB alike.
    whole = read_table(out, "loss_parts")
    assert whole.num_rows == 426 + 120 and set(whole.column("run").to_pylist()) == {"rg", "cp"}
    frame = pd.read_parquet(out / "loss_parts")
    assert len(frame) == 546 and set(frame["run"].astype(str)) == {"rg", "cp"}
    con = duckdb.connect()
    n = con.execute(
        f"SELECT COUNT(*) FROM read_parquet('{out}/loss_parts/*/*.parquet', hive_partitioning=1) WHERE run = 'rg'"
    ).fetchone()[0]
    assert n == 426


def test_reingest_writes_no_new_rows(store, samples, tmp_path):
    out = tmp_path / "pq"
    _ingest(store, "rg", samples / "resume-gap.log", out)
    _ingest(store, "rg", samples / "resume-gap.log", out)
    assert read_table(out, "loss_parts", "rg").num_rows == 426


def test_catch_up_writes_what_sql_has_and_parquet_lacks(store, samples, tmp_path):
    """A collector killed between a commit and its Parquet flush: the next one writes the
    missing rows, on both databases, and a second catch-up writes nothing."""
    from steptail.storage.catchup import catch_up

    out = tmp_path / "pq"
    _ingest(store, "rg", samples / "resume-gap.log", None)  # SQL only: Parquet lacks everything
    tables = ("loss_parts", "required_rbf", "pod_metrics", "config", "checkpoints")
    with store.engine.connect() as conn:
        counts = {t: conn.execute(sa.text(f"SELECT COUNT(*) FROM {t} WHERE run = 'rg'")).scalar() for t in tables}
    assert counts["loss_parts"] > 100 and counts["config"] > 0 and counts["checkpoints"] > 0
    # Parquet already holds the first half of loss_parts (what flushed before the kill)
    with store.engine.connect() as conn:
        half = conn.execute(sa.text(
            "SELECT run, incarnation, step, ts_ns, ce, ce_raw, parts FROM loss_parts WHERE run = 'rg'"
            " ORDER BY incarnation, step LIMIT :n"), {"n": counts["loss_parts"] // 2}).all()
    from steptail.runs.model import Batch
    from steptail.storage.parquet import ParquetSink

    sink = ParquetSink(out, "rg")
    sink.write(Batch(loss_parts=[tuple(r[:6]) + (r[6] if isinstance(r[6], str) else json.dumps(r[6]),)
                                 for r in half]))
    sink.commit()

    written = catch_up(store, "rg", out, chunk=7)  # many chunks, one file per table
    assert written == sum(counts.values()) - len(half)
    assert catch_up(store, "rg", out) == 0
    for t in tables:
        got = read_table(out, t, "rg")
        assert got.num_rows == counts[t], t
    lp = read_table(out, "loss_parts", "rg").to_pydict()
    keys = list(zip(lp["incarnation"], lp["step"], strict=True))
    assert len(set(keys)) == len(keys)
    assert all(isinstance(p, list) and p for p in lp["parts"])  # map<string, double>: (key, value) pairs
    per_layer = read_table(out, "required_rbf", "rg").column("per_layer").to_pylist()
    assert all(isinstance(v, list) and v for v in per_layer)


def test_per_layer_json_becomes_lists_of_doubles():
    import pyarrow as pa

    from steptail.storage.parquet import _layers

    got = _layers(pa.array(["[1.0,2.5]", "[]", '["nan",1.0]', '["inf","-inf"]', "[-0.0,1e-05]"])).to_pylist()
    assert got[:2] == [[1.0, 2.5], []] and math.isnan(got[2][0]) and got[2][1] == 1.0
    assert got[3] == [math.inf, -math.inf] and got[4] == [-0.0, 1e-05] and math.copysign(1, got[4][0]) == -1
    assert _layers(pa.array(["[1.0]", "[2.0,3.0]"])).to_pylist() == [[1.0], [2.0, 3.0]]  # the usual block
