"""`steptail compact [RUN] --parquet DIR`: one Parquet file per run and table."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

import click

from steptail.commands._common import fail
from steptail.output import Column, Output, output_option
from steptail.storage.compact import ROW_GROUP_ROWS


@click.command()
@click.argument("run", required=False)
@click.option("--parquet", "root", metavar="DIR", required=True, type=click.Path(path_type=Path),
              help="The dataset: DIR/<table>/run=<run>/part-*.parquet.")
@click.option("--row-group-rows", type=click.IntRange(min=1), default=ROW_GROUP_ROWS, show_default=True,
              help="Rows per row group of a compacted file (big runs: one file, several row groups).")
@output_option()
def command(run: str | None, root: Path, row_group_rows: int, output: Output) -> None:
    """Compact the Parquet dataset: each table's part files of a run (one per follow flush or
    ingest) become one file. All runs, or RUN only.

    \b
    - Safe while readers read: the new file is written under a hidden name, fsynced and
      renamed into place, then the parts it replaces go; a reader never counts a row twice.
      A compaction cut short (a crash) is finished by the next one, or by `follow --parquet`.
    - Safe while `follow` writes: parts published after it started are kept, for next time.
    - Files of the first schema (`parts` as JSON text) are rewritten with `parts` as a map.
    - Running it again changes nothing. `follow` compacts its runs when it stops, and
      `export --parquet DIR` the exported run.
    """
    from steptail.runs.names import RunNameError, check_run_name
    from steptail.storage.compact import compact_folder, run_folders
    from steptail.storage.parquet import ParquetError

    if not root.is_dir():
        fail(f"Parquet directory {root} does not exist")
    if run is not None:
        try:
            check_run_name(run)
        except RunNameError as exc:
            fail(str(exc))
    folders = run_folders(root, run)
    if run is not None and not folders:
        fail(f"no run {run!r} under {root}")
    done = []
    bar = sys.stderr.isatty() and len({f.name for _, f in folders}) > 1
    try:
        with click.progressbar(folders, label="compacting", file=sys.stderr,
                               item_show_func=lambda item: item and f"{item[0]}/{item[1].name}") if bar \
                else _plain(folders) as items:
            for table, folder in items:
                done.append(compact_folder(folder, table, row_group_rows))
    except ParquetError as exc:
        fail(str(exc))
    if output.machine:
        output.data([asdict(d) for d in done])
        return
    if output.format == "wide":
        output.table([Column(k, k) for k in (asdict(done[0]) if done else {})], [asdict(d) for d in done])
        return
    runs = len({d.run for d in done})
    before, after = sum(d.files_before for d in done), sum(d.files_after for d in done)
    rewritten = sum(d.rewritten for d in done)
    click.echo(f"{runs} run{'s' * (runs != 1)}: {before} files -> {after}"
               f" ({rewritten} table{'s' * (rewritten != 1)} rewritten)")


class _plain:
    """The progress bar's stand-in when stderr is not a terminal."""

    def __init__(self, items):
        self.items = items

    def __enter__(self):
        return self.items

    def __exit__(self, *exc):
        return False
