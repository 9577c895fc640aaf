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
        with store.engine.connect() as conn:
            for table in SCHEMAS:
                cols = COLUMNS[table]
                have = _parquet_keys(run_folder(root, table, run), table)
                sql = f"SELECT {', '.join(cols)} FROM {table} WHERE run = :run"
                params: dict = {"run": run}
                if table in STEP_TABLES and have:
                    sql += " AND (incarnation > :inc OR (incarnation = :inc AND step > :step))"
                    params |= dict(zip(("inc", "step"), max(have), strict=True))
                key_at = [cols.index(k) for k in _SMALL_KEYS.get(table, ())]
                json_at = [i for i, c in enumerate(cols) if c in _JSON]
                result = conn.execution_options(stream_results=True).execute(sa.text(sql), params)
                while found := result.fetchmany(chunk):
                    if key_at:
                        found = [r for r in found if tuple(r[i] for i in key_at) not in have]
                    rows = [
                        tuple(json.dumps(v, separators=(",", ":")) if i in json_at and not isinstance(v, str | None)
                              else v for i, v in enumerate(r))
                        for r in found
                    ]
                    if rows:
                        sink.write(Batch(**{table: rows}))
                        written += len(rows)
        sink.commit()
    except BaseException:
        sink.abort()
        raise
    write_snapshots(store, run, root)
    return written


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
