"""Back-fill: what SQL holds for a run but a copy of its rows lacks, written from SQL — the
local Parquet dataset (catch_up) and the lake (catch_up_lake) alike. The copy's keys are read
(storage.row_keys), SQL's rows streamed in chunks, and only the rows whose keys the copy lacks
written: a run stored before --parquet named the copy, a collector killed between a commit and
its next flush, rows another path (an archive, an ingest) added out of key order. Exactly once
however often it runs; rows written live meanwhile are keys like any other.

Apart from steptail.storage.parquet (the writer and the schemas) because it also finishes a
cut-short compaction and rewrites the run's snapshot tables (steptail.storage.compact), which
itself builds on steptail.storage.parquet."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa

from steptail.runs.rows import STEP_TABLES
from steptail.storage.compact import folder_lock, recover, write_snapshots
from steptail.storage.parquet import SCHEMAS, ParquetSink, run_folder, to_arrow, visible_files
from steptail.storage.row_keys import KEYS, HeldKeys
from steptail.storage.sql import COLUMNS

_JSON = {"parts", "per_layer", "extra"}


def catch_up(store, run: str, root: str | Path, chunk: int = 50_000) -> int:
    """Write to the Parquet dataset at `root` every row SQL holds for `run` whose key the run's
    files lack. Returns rows written; 0 when Parquet is complete, so calling it again writes
    nothing. Rows are read and written `chunk` at a time: memory stays flat however much is
    missing. Each table under its folder's lock (storage.compact): a compaction hides parts
    for a moment, and two back-fills must not both write a missing row. The run's findings,
    stream gaps and reconnects are written afresh too."""
    written = 0
    for table in SCHEMAS:
        count = row_count(store, table, run)
        if not count:
            continue
        folder = run_folder(root, table, run)
        recover(folder)  # a compaction cut short hides parts: their keys must count
        made = _make_folder(folder)
        sink = ParquetSink(root, run)
        try:
            with folder_lock(folder):
                held = HeldKeys.of(table, _parquet_keys(folder, table))
                for data in missing_rows(store, table, run, held, count, chunk):
                    sink.write_table(table, data)
                    written += data.num_rows
                sink.commit()
        except BaseException:
            sink.abort()
            for path in reversed(made):  # deepest first, and only if still empty
                try:
                    path.rmdir()
                except OSError:
                    pass
            raise
    write_snapshots(store, run, root)
    return written


def row_count(store, table: str, run: str) -> int:
    with store.engine.connect() as conn:
        return conn.execute(sa.text(f"SELECT COUNT(*) FROM {table} WHERE run = :run"), {"run": run}).scalar()


def missing_rows(store, table: str, run: str, held: HeldKeys, count: int, chunk: int = 50_000) -> Iterator[pa.Table]:
    """SQL's `count` rows of `table` for `run` whose keys `held` lacks, as tables of the
    dataset's schema, `chunk` rows read at a time. A copy holding as many keys as SQL has rows
    is complete: SQL is not read further."""
    if held.size() >= count:
        return
    for rows in sql_rows(store, table, run, chunk):
        data = held.new(table, to_arrow(table, rows))
        if data.num_rows:
            yield data


def sql_rows(store, table: str, run: str, chunk: int = 50_000):
    """The run's rows of one table as SQL holds them, as Batch row tuples, `chunk` at a time;
    per-step tables in key order (the files read as the log ran)."""
    cols = COLUMNS[table]
    sql = f"SELECT {', '.join(cols)} FROM {table} WHERE run = :run"
    if table in STEP_TABLES:
        sql += " ORDER BY incarnation, step"
    json_at = [i for i, c in enumerate(cols) if c in _JSON]
    with store.engine.connect() as conn:
        result = conn.execution_options(stream_results=True).execute(sa.text(sql), {"run": run})
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
    from steptail.storage.parquet import SNAPSHOT_SCHEMAS

    written = 0
    for table in SCHEMAS:
        held = lake.held(table, run)  # first: it makes the table, rows or not
        for data in missing_rows(store, table, run, held, row_count(store, table, run), chunk):
            written += lake.append(table, {run: as_lake_rows(table, run, data)})
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


def _make_folder(folder: Path) -> list[Path]:
    """`folder` and its missing parents made (the lock needs it); the ones made, outermost first."""
    made = []
    for missing in (folder, *folder.parents):
        if missing.exists():
            break
        made.append(missing)
    folder.mkdir(parents=True, exist_ok=True)
    return made[::-1]


def _parquet_keys(folder: Path, table: str) -> pa.Table | None:
    """The key columns of a run's Parquet files of one table (None: no file)."""
    files = visible_files(folder)
    if not files:
        return None
    keys = KEYS[table]
    return pq.read_table(files, columns=list(keys), schema=pa.schema([SCHEMAS[table].field(k) for k in keys]))
