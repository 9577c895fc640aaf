"""`steptail compact [RUN] --parquet DIR|URL [--to-table URL]`: one Parquet file per run and
table, of a local dataset or of the lake's tables; or a local dataset converted into the lake."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import click

from steptail.commands._common import count, db_option, fail, store_or_exit
from steptail.commands._progress import progress_bar, wanted
from steptail.commands.lake import LOCATION, lake_runs, open_lake, store_runs, table_location
from steptail.output import Column, Output, output_option
from steptail.storage.compact import ROW_GROUP_ROWS


@click.command()
@click.argument("run", required=False)
@click.option("--parquet", "root", metavar="DIR|URL", required=True,
              help=f"The Parquet to compact: {LOCATION}. A DIR is a local dataset: "
                   "DIR/<table>/run=<run>/part-*.parquet. Required.")
@click.option("--to-table", "to_table", metavar="URL",
              help="Convert the local dataset --parquet DIR into the lake at URL (s3://BUCKET/PREFIX, "
                   "gs://BUCKET/PREFIX, file:///DIR; the catalog in --db) instead: every row appended once "
                   "(running it again adds nothing); DIR is left as it is.")
@click.option("--row-group-rows", type=click.IntRange(min=1), default=ROW_GROUP_ROWS, show_default=True,
              help="Rows per row group of a compacted file (big runs: one file, several row groups). A local "
                   "dataset only.")
@db_option
@output_option()
def command(run: str | None, root: str, to_table: str | None, row_group_rows: int, db: str | None,
            output: Output) -> None:
    """Compact Parquet: each table's files of a run (one per follow flush or ingest) become
    one file. All runs, or RUN only.

    \b
    A local dataset (--parquet DIR):
    - Safe while readers read: the new file is written under a hidden name, fsynced and
      renamed into place, then the parts it replaces go; a reader never counts a row twice.
      A compaction cut short (a crash) is finished by the next one, or by `follow --parquet`.
    - Safe while `follow` writes: parts published after it started are kept, for next time.
    - Files of the first schema (`parts` as JSON text) are rewritten with `parts` as a map.
    - Running it again changes nothing. `follow` compacts its runs when it stops, and
      `export --parquet DIR` the exported run.

    \b
    The lake (--parquet URL; its catalog in --db): one commit per table and run that adds
    the new file and marks the old ones removed; nothing is deleted (they stay in the bucket,
    readers no longer see them). Every run the store or the tables hold, or RUN.

    \b
    --to-table URL converts a local dataset into the lake, once: each run's rows are
    appended exactly once by key (a rerun adds nothing), its findings, stream gaps and
    reconnects replace the table's. DIR is read, never changed.

    \b
    Examples:
      steptail compact --parquet parquet
      steptail compact --parquet parquet --to-table gs://my-bucket/steptail
      steptail compact clean-300 --parquet s3://my-bucket/steptail
    """
    from steptail.runs.names import RunNameError, check_run_name

    if run is not None:
        try:
            check_run_name(run)
        except RunNameError as exc:
            fail(str(exc))
    if to_table is not None and "://" in root:
        fail("--to-table converts a local dataset: --parquet must be a folder, not a URL")
    lake = table_location(root)
    if to_table is not None:
        if not table_location(to_table, "--to-table"):
            fail(f"--to-table {to_table}: give s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or file:///DIR")
        _convert(Path(root), to_table, run, db, output)
    elif lake:
        _compact_lake(root, run, db, output)
    else:
        _compact_folder(Path(root), run, row_group_rows, output)


def _compact_folder(root: Path, run: str | None, row_group_rows: int, output: Output) -> None:
    from steptail.storage.compact import compact_folder, run_folders
    from steptail.storage.parquet import ParquetError

    if not root.is_dir():
        fail(f"Parquet directory {root} does not exist")
    folders = run_folders(root, run)
    if run is not None and not folders:
        fail(f"no run {run!r} under {root}")
    done = []
    try:
        # a bar on a terminal whatever the number of runs: one big run's tables take seconds too
        with progress_bar("compact", wanted(output.machine), unit="tables") as progress:
            for table, folder in folders:
                if progress:
                    progress(len(done), len(folders))
                done.append(compact_folder(folder, table, row_group_rows))
    except ParquetError as exc:
        fail(str(exc))
    _report([asdict(d) for d in done], output)


def _compact_lake(url: str, run: str | None, db: str | None, output: Output) -> None:
    from steptail.storage.lake import TABLES, LakeError

    store = store_or_exit(db, create=False)
    try:
        lake = open_lake(store, url)
        try:
            runs = [run] if run is not None else sorted(set(store_runs(store)) | set(lake_runs(lake)))
            done = []
            with progress_bar("compact", wanted(output.machine), unit="tables") as progress:
                for i, name in enumerate(runs):
                    for j, table in enumerate(TABLES):
                        if progress:
                            progress(i * len(TABLES) + j, len(runs) * len(TABLES))
                        before, after = lake.compact(table, name)
                        if before:
                            done.append({"table": table, "run": name, "files_before": before, "files_after": after,
                                         "rewritten": after < before})
        except LakeError as exc:
            fail(str(exc))
    finally:
        store.dispose()
    if run is not None and not done:
        fail(f"no run {run!r} in the lake at {url}")
    _report(done, output)


def _report(done: list[dict], output: Output) -> None:
    if output.machine:
        output.data(done)
        return
    if output.format == "wide":
        output.table([Column(k, k) for k in (done[0] if done else {})], done)
        return
    runs = len({d["run"] for d in done})
    before, after = sum(d["files_before"] for d in done), sum(d["files_after"] for d in done)
    rewritten = sum(bool(d["rewritten"]) for d in done)
    click.echo(f"{count(runs, 'run')}: {count(before, 'file')} -> {after}"
               f" ({count(rewritten, 'table')} rewritten)")


def _convert(root: Path, url: str, run: str | None, db: str | None, output: Output) -> None:
    """The local dataset under `root` (every run, or `run`) into the lake at `url`: per run,
    each row table's rows appended exactly once by key, each snapshot table replaced (unless
    the lake already holds the same rows). Progress: a line per run, and a bar on a terminal."""
    from steptail.storage.compact import run_folders
    from steptail.storage.lake import LakeError
    from steptail.storage.parquet import ParquetError, run_folder

    if not root.is_dir():
        fail(f"Parquet directory {root} does not exist")
    runs = sorted({f.name.removeprefix("run=") for _, f in run_folders(root, run)}
                  | {f.name.removeprefix("run=") for t in ("findings", "stream_gaps", "stream_reconnects")
                     for f in ((root / t).glob("run=*") if run is None else [run_folder(root, t, run)])
                     if f.is_dir()})
    if run is not None and not runs:
        fail(f"no run {run!r} under {root}")
    store = store_or_exit(db)  # the lake's catalog lives in the store's database
    done = []
    try:
        lake = open_lake(store, url)
        with progress_bar("convert", wanted(output.machine), unit="runs") as progress:
            _convert_runs(root, lake, runs, output, done, progress)
    except (LakeError, ParquetError) as exc:
        fail(str(exc))
    finally:
        store.dispose()
    if output.machine:
        output.data(done, [{k: v for k, v in d.items() if k != "tables"} for d in done])
        return
    total = sum(d["rows_added"] for d in done)
    output.line(f"{count(len(done), 'run')} into {url}: {count(total, 'row')} added", markup=False)


def _convert_runs(root: Path, lake, runs: list[str], output: Output, done: list[dict], progress) -> None:
    from steptail.storage.compact import recover
    from steptail.storage.lake import as_lake_rows
    from steptail.storage.parquet import SCHEMAS, read_table, run_folder

    for i, name in enumerate(runs):
        if progress:
            progress(i, len(runs))
        read = added = 0
        tables: dict[str, int] = {}
        for table in (*SCHEMAS, "findings", "stream_gaps", "stream_reconnects"):
            folder = run_folder(root, table, name)
            if not folder.is_dir():
                continue
            recover(folder)  # a compaction cut short: its hidden parts are rows too
            rows = as_lake_rows(table, name, read_table(root, table, name))
            read += rows.num_rows
            if table in SCHEMAS:
                n = lake.append(table, {name: rows}) if rows.num_rows else 0
            else:
                n = _replace(lake, table, name, rows)
            tables[table] = n
            added += n
        done.append({"run": name, "rows_read": read, "rows_added": added, "tables": tables})
        if not output.machine:
            output.line(f"{name}: {count(read, 'row')} read, {added} added", markup=False)


def _replace(lake, table: str, run: str, rows) -> int:
    """A snapshot table's rows of `run` replace the lake's, unless they are the same (a rerun
    commits nothing). Returns the rows written."""
    held = lake.read(table, run)
    if held.num_rows == rows.num_rows and sorted(map(repr, held.to_pylist())) == sorted(map(repr, rows.to_pylist())):
        return 0
    lake.replace(table, {run: rows})
    return rows.num_rows
