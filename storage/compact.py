"""Compaction of the Parquet dataset, and the run tables rewritten whole from SQL (findings,
stream gaps, stream reconnects).

Readers glob `*.parquet`, so replacing files must never show a row twice. Under an exclusive
lock on the run's folder (flock on the directory: the kernel drops it when the process dies):

1. the new file is written as `.NAME.compacting`, fsynced, renamed `.NAME.ready`; its footer
   lists the files it replaces;
2. each replaced file is renamed `.PART.replaced` (hidden: a reader now misses those rows for
   a moment, never counts them twice);
3. `.NAME.ready` is renamed `NAME` and the folder fsynced: every row is visible once again;
4. the hidden files are removed.

A process killed part-way leaves a state `recover` finishes under the same lock (compaction,
catch_up and so `follow --parquet` at start run it): `.compacting` is removed (nothing was
hidden yet), `.ready` rolled forward (its files hidden, itself published), `.replaced` removed.
Files published while a compaction runs (a live follow's flush) are not in its list: kept."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa

from steptail.runs.rows import FINDINGS
from steptail.storage.durable import fsync_path, hidden_name
from steptail.storage.parquet import (
    DICTIONARY,
    SCHEMAS,
    SNAPSHOT_SCHEMAS,
    ParquetError,
    run_folder,
    upgrade,
    visible_files,
)

REPLACES_KEY = b"steptail.replaces"  # footer metadata of a compacted file: the names it replaced
ROW_GROUP_ROWS = 128 * 1024


@dataclass
class Compacted:
    table: str
    run: str
    files_before: int
    files_after: int
    rows: int  # rewritten (0 when nothing was to do)
    rewritten: bool


def _crash_point(step: str) -> None:
    """Tests replace this to stop a swap at `step` as a killed process would."""


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def recover(folder: Path) -> None:
    """Finish a swap a killed process left half-done in `folder` (nothing to do usually)."""
    if not folder.is_dir():
        return
    with folder_lock(folder):
        _recover_locked(folder)


def _recover_locked(folder: Path) -> None:
    names = os.listdir(folder)
    if not any(n.startswith(".") and n.endswith((".compacting", ".ready", ".replaced")) for n in names):
        return
    for name in names:
        if name.startswith(".") and name.endswith(".compacting"):
            (folder / name).unlink(missing_ok=True)
    for name in sorted(n for n in names if n.startswith(".") and n.endswith(".ready")):
        ready = folder / name
        try:
            replaces = json.loads(pq.read_schema(ready).metadata[REPLACES_KEY])
        except Exception:  # noqa: BLE001 - unreadable: put back what it would have replaced
            ready.unlink(missing_ok=True)
            for hidden in folder.glob(".*.replaced"):
                hidden.rename(folder / hidden.name[1:-len(".replaced")])
            continue
        for part in replaces:
            if (folder / part).exists():
                (folder / part).rename(hidden_name(folder / part, "replaced"))
        ready.rename(folder / name[1:-len(".ready")])
    fsync_path(folder, directory=True)
    for hidden in folder.glob(".*.replaced"):
        hidden.unlink(missing_ok=True)


def _swap(folder: Path, replaced: list[Path], write: Callable[[Path, dict], None]) -> Path:
    """Publish the file `write` makes in place of `replaced` (steps 1-4 above). The caller
    holds the folder's lock. An error before publishing puts everything back."""
    final = folder / f"part-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}.parquet"
    writing, ready = hidden_name(final, "compacting"), hidden_name(final, "ready")
    hidden: list[tuple[Path, Path]] = []
    try:
        write(writing, {REPLACES_KEY: json.dumps([p.name for p in replaced]).encode()})
        fsync_path(writing)
        writing.rename(ready)
        fsync_path(folder, directory=True)
        _crash_point("ready")
        for part in replaced:
            to = hidden_name(part, "replaced")
            part.rename(to)
            hidden.append((part, to))
        _crash_point("hidden")
        ready.rename(final)
    except Exception:
        restored = True
        for part, to in reversed(hidden):
            try:
                to.rename(part)
            except OSError:
                restored = False
        writing.unlink(missing_ok=True)
        if restored:  # else `recover` rolls the ready file forward
            ready.unlink(missing_ok=True)
        raise
    fsync_path(folder, directory=True)
    _crash_point("published")
    for _, to in hidden:
        to.unlink(missing_ok=True)
    return final


def compact_folder(folder: Path, table: str, row_group_rows: int = ROW_GROUP_ROWS) -> Compacted:
    """The files of one run and table -> one file in the current schema, row groups of
    `row_group_rows`. Nothing is rewritten when that is already so (idempotent)."""
    run = folder.name.removeprefix("run=")
    with _parquet_errors(folder), folder_lock(folder):
        _recover_locked(folder)
        parts = visible_files(folder)
        if len(parts) == 0 or len(parts) == 1 and pq.read_schema(parts[0]).remove_metadata() == SCHEMAS[table]:
            return Compacted(table, run, len(parts), len(parts), 0, rewritten=False)
        rows = 0

        def write(path: Path, metadata: dict) -> None:
            nonlocal rows
            rows = _write_merged(path, table, parts, metadata, row_group_rows)

        _swap(folder, parts, write)
        return Compacted(table, run, len(parts), 1, rows, rewritten=True)


def _write_merged(path: Path, table: str, parts: list[Path], metadata: dict, row_group_rows: int) -> int:
    """Stream the parts' rows into one file, a row group at a time (memory stays bounded)."""
    schema = SCHEMAS[table].with_metadata(metadata)
    pending: list[pa.Table] = []
    buffered = written = 0
    with pq.ParquetWriter(path, schema, compression="zstd", use_dictionary=list(DICTIONARY[table])) as writer:
        for part in parts:
            with pq.ParquetFile(part) as source:
                for batch in source.iter_batches(batch_size=row_group_rows):
                    pending.append(upgrade(table, pa.Table.from_batches([batch])))
                    buffered += batch.num_rows
                    while buffered >= row_group_rows:
                        merged = pa.concat_tables(pending)
                        writer.write_table(merged.slice(0, row_group_rows), row_group_size=row_group_rows)
                        rest = merged.slice(row_group_rows)
                        pending, buffered = [rest], rest.num_rows
                        written += row_group_rows
        if buffered:
            writer.write_table(pa.concat_tables(pending), row_group_size=row_group_rows)
            written += buffered
    return written


def run_folders(root: str | Path, run: str | None = None) -> list[tuple[str, Path]]:
    """(table, folder) of every run (or one) of the compacted tables, as found on disk."""
    found = []
    for table in SCHEMAS:
        base = Path(root) / table
        if run is not None:
            folder = run_folder(root, table, run)
            if folder.is_dir():
                found.append((table, folder))
        elif base.is_dir():
            found += [(table, f) for f in sorted(base.glob("run=*")) if f.is_dir()]
    return found


def compact(root: str | Path, run: str | None = None, row_group_rows: int = ROW_GROUP_ROWS,
            progress: Callable[[Compacted], None] | None = None) -> list[Compacted]:
    """Compact every run (or one) of the dataset under `root`."""
    done = []
    for table, folder in run_folders(root, run):
        done.append(compact_folder(folder, table, row_group_rows))
        if progress is not None:
            progress(done[-1])
    return done


_SNAPSHOT_SQL = {
    "findings": f"SELECT {', '.join(FINDINGS[1:])}"
                " FROM findings WHERE run = :run ORDER BY detected_ns, kind, incarnation, first_step",
    "stream_gaps": "SELECT stream, start_ns, end_ns, reason, detected_ns FROM stream_gaps"
                   " WHERE run = :run ORDER BY start_ns, stream",
    "stream_reconnects": "SELECT stream, ts_ns, reason FROM stream_reconnects WHERE run = :run"
                         " ORDER BY ts_ns, stream",
}


def write_snapshots(store, run: str, root: str | Path) -> None:
    """Write the run's findings, stream gaps and reconnects as they are in SQL now, each as
    one file replacing the previous ones. SQL is read under the folder's lock, so a later
    snapshot never loses to an earlier one."""
    for table in _SNAPSHOT_SQL:
        folder = run_folder(root, table, run)
        with _parquet_errors(folder):
            folder.mkdir(parents=True, exist_ok=True)
            with folder_lock(folder):
                _recover_locked(folder)
                with store.engine.connect() as conn:
                    data = snapshot_table(conn, table, run)

                def write(path: Path, metadata: dict, data=data) -> None:
                    pq.write_table(data.replace_schema_metadata(metadata), path, compression="zstd")

                _swap(folder, visible_files(folder), write)


def snapshot_table(conn, table: str, run: str) -> pa.Table:
    """One snapshot table of `run` as SQL holds it now (the local dataset and the lake write it)."""
    schema = SNAPSHOT_SCHEMAS[table]
    rows = conn.execute(sa.text(_SNAPSHOT_SQL[table]), {"run": run}).all()
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(schema)
    return pa.Table.from_arrays([  # *_ns integers -> timestamps
        pa.array(col, pa.int64()).cast(f.type) if pa.types.is_timestamp(f.type) else pa.array(col, f.type)
        for f, col in zip(schema, columns, strict=True)
    ], schema=schema)


@contextlib.contextmanager
def _parquet_errors(folder: Path) -> Iterator[None]:
    try:
        yield
    except ParquetError:
        raise
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc).strip().splitlines()[0]
        raise ParquetError(f"cannot write Parquet under {folder}: {reason}") from exc
    except pa.ArrowException as exc:  # a damaged file
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ParquetError(f"cannot read Parquet under {folder}: {reason}") from exc
