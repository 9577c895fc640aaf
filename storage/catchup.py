"""Parquet catch-up: what SQL holds for a run but its Parquet files lack (a collector killed
between a commit and its next Parquet flush, or a Parquet failure) is written from SQL.

Apart from steptail.storage.parquet (the writer and the schemas) because it also finishes a
cut-short compaction and rewrites the run's snapshot tables (steptail.storage.compact), which
itself builds on steptail.storage.parquet."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import sqlalchemy as sa

from steptail.runs.model import Batch
from steptail.runs.rows import STEP_TABLES
from steptail.storage.compact import recover, write_snapshots
from steptail.storage.parquet import SCHEMAS, ParquetSink, run_folder, visible_files
from steptail.storage.sql import COLUMNS

# Per-step tables are written in (incarnation, step) order, so what a killed collector did
# not flush is everything in SQL past the last key in Parquet. The small tables are compared
# key by key.
_SMALL_KEYS = {"config": ("incarnation", "name"), "checkpoints": ("incarnation", "kind", "step")}
_JSON = {"parts", "per_layer", "extra"}


def catch_up(store, run: str, root: str | Path, chunk: int = 50_000) -> int:
    """Write to Parquet what SQL holds for `run` but the run's Parquet files do not (a
    collector killed between a commit and its next Parquet flush). Returns rows written;
    0 when Parquet is complete, so calling it again writes nothing. Rows are read and
    written `chunk` at a time: memory stays flat however much is missing. The run's findings,
    stream gaps and reconnects are written afresh too."""
    sink, written = ParquetSink(root, run), 0
    for table in SCHEMAS:  # a compaction cut short hides parts: their keys must count
        recover(run_folder(root, table, run))
    try:
        for table in SCHEMAS:
            have = _parquet_keys(run_folder(root, table, run), table)
            after = max(have) if table in STEP_TABLES and have else None
            for rows in sql_rows(store, table, run, chunk, after):
                if table not in STEP_TABLES:
                    key_at = [COLUMNS[table].index(k) for k in _SMALL_KEYS[table]]
                    rows = [r for r in rows if tuple(r[i] for i in key_at) not in have]
                if rows:
                    sink.write(Batch(**{table: rows}))
                    written += len(rows)
        sink.commit()
    except BaseException:
        sink.abort()
        raise
    write_snapshots(store, run, root)
    return written


def sql_rows(store, table: str, run: str, chunk: int = 50_000, after: tuple[int, int] | None = None):
    """The run's rows of one table as SQL holds them, as Batch row tuples, `chunk` at a time;
    per-step tables in key order, past `after` (incarnation, step) when given."""
    cols = COLUMNS[table]
    sql = f"SELECT {', '.join(cols)} FROM {table} WHERE run = :run"
    params: dict = {"run": run}
    if after is not None:
        sql += " AND (incarnation > :inc OR (incarnation = :inc AND step > :step))"
        params |= dict(zip(("inc", "step"), after, strict=True))
    if table in STEP_TABLES:
        sql += " ORDER BY incarnation, step"
    json_at = [i for i, c in enumerate(cols) if c in _JSON]
    with store.engine.connect() as conn:
        result = conn.execution_options(stream_results=True).execute(sa.text(sql), params)
        while found := result.fetchmany(chunk):
            yield [
                tuple(json.dumps(v, separators=(",", ":")) if i in json_at and not isinstance(v, str | None)
                      else v for i, v in enumerate(r))
                for r in found
            ]


def catch_up_lake(store, run: str, lake, chunk: int = 50_000, snapshots: bool = True) -> int:
    """The lake's catch-up (storage.lake): every row SQL holds for `run` whose key the table
    does not hold is appended (the append itself drops the keys held, exactly once), then
    (`snapshots`) the run's findings, stream gaps and reconnects replace the table's. A table
    holding as many keys as SQL has rows is complete and not read further. Returns rows added."""
    from steptail.storage.compact import snapshot_table
    from steptail.storage.lake import as_lake_rows
    from steptail.storage.parquet import SNAPSHOT_SCHEMAS, to_arrow

    written = 0
    for table in SCHEMAS:
        held = lake.held(table, run)
        with store.engine.connect() as conn:
            count = conn.execute(sa.text(f"SELECT COUNT(*) FROM {table} WHERE run = :run"), {"run": run}).scalar()
        if held.size() >= count:
            continue
        for rows in sql_rows(store, table, run, chunk):
            data = held.new(table, as_lake_rows(table, run, to_arrow(table, rows)))
            if data.num_rows:
                written += lake.append(table, {run: data})
    if snapshots:
        with store.engine.connect() as conn:
            data = {t: as_lake_rows(t, run, snapshot_table(conn, t, run)) for t in SNAPSHOT_SCHEMAS}
        for table, rows in data.items():
            if not _same_rows(lake.read(table, run), rows):  # a commit only when they changed
                lake.replace(table, {run: rows})
    return written


def _same_rows(a, b) -> bool:
    if a.num_rows != b.num_rows:
        return False
    key = [(name, "ascending") for name in a.column_names]
    try:
        return a.sort_by(key).equals(b.select(a.column_names).cast(a.schema).sort_by(key))
    except Exception:  # noqa: BLE001 - types not comparable: call them different (one commit)
        return False


def _parquet_keys(folder: Path, table: str) -> set[tuple]:
    """The keys in a run's Parquet files of one table (per-step tables: only the last)."""
    files = visible_files(folder)
    if not files:
        return set()
    keys = ("incarnation", "step") if table in STEP_TABLES else _SMALL_KEYS[table]
    data = pq.read_table(files, columns=list(keys), schema=pa.schema([SCHEMAS[table].field(k) for k in keys]))
    if data.num_rows == 0:
        return set()
    if table in STEP_TABLES:
        inc = pc.max(data["incarnation"]).as_py()
        steps = pc.filter(data["step"], pc.equal(data["incarnation"], inc))
        return {(inc, pc.max(steps).as_py())}
    return set(zip(*(data[k].to_pylist() for k in keys), strict=True))
