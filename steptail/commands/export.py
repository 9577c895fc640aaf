"""`steptail export RUN --out DIR`: the ledger bundle of a run."""

from __future__ import annotations

from pathlib import Path

import click

from steptail.commands._common import count, db_option, fail, store_or_exit
from steptail.commands._progress import progress_bar, wanted
from steptail.commands.lake import LOCATION, open_lake, table_location
from steptail.output import Output, output_option


@click.command()
@click.argument("run")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path),
              help="Directory to create, and its missing parents (written elsewhere first, then renamed into place).")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@click.option("--parquet", metavar="DIR|URL",
              help=f"Also bring RUN's Parquet up to date: {LOCATION}. A DIR: the rows SQL holds and its files"
                   " lack written (each key once), its parts compacted to one file per table, its findings,"
                   " stream gaps and reconnects written. A URL: what SQL holds and"
                   " the tables lack appended (exactly once), then RUN's files of each table compacted.")
@db_option
@output_option()
def command(run: str, out: Path, force: bool, parquet: str | None, db: str | None, output: Output) -> None:
    """Export RUN for the experiment ledger: Parquet per table, manifest.json, ce.png.

    The bundle is self-contained plain Parquet, whatever --parquet names.

    
    Examples:
      steptail export sft-7 --out ledger/sft-7 --parquet parquet
      steptail export sft-7 --out ledger/sft-7 --parquet s3://my-bucket/steptail
    """
    from steptail.api import Steptail, UnknownRun
    from steptail.storage.export import ExportError, check_export_name

    try:
        check_export_name(run)
    except ExportError as exc:
        fail(str(exc))
    lake = table_location(parquet)
    if parquet is not None and not lake and not Path(parquet).is_dir():
        fail(f"Parquet directory {parquet} does not exist")
    store = store_or_exit(db, create=False)
    if lake:
        lake = open_lake(store, parquet)  # before the bundle: a catalog no command can use is exit 2 now
    try:
        with progress_bar(f"export {run}", wanted(output.machine), unit="stages") as progress:
            manifest = Steptail(store).export(run, out, force=force, progress=progress)
    except (ExportError, UnknownRun) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror or exc}")
    compacted = filled = None
    if lake:
        compacted = _update_lake(store, run, lake)
    elif parquet is not None:
        filled = _update_parquet(store, run, Path(parquet))
    if output.machine:
        output.data({"out": str(out), "manifest": manifest} | ({"lake": compacted} if compacted else {})
                    | ({"parquet": {"dir": parquet, "rows_back_filled": filled}} if filled is not None else {}))
    else:
        c = manifest["counts"]
        click.echo(f"exported {run} to {out}: {count(c['loss_parts'], 'loss row')}, {c['required_rbf']}"
                   f" REQUIRED_RBF, {count(c['pod_metrics'], 'pod metric')}, {count(c['findings'], 'finding')},"
                   f" {count(c['incarnations'], 'incarnation')}")
        if filled:
            output.line(f"parquet {parquet}: {count(filled, 'row')} written from SQL", markup=False)
        if compacted:
            output.line(f"lake {parquet}: {count(compacted['rows_added'], 'row')} added; "
                        f"{count(compacted['files_before'], 'file')} -> {compacted['files_after']}", markup=False)


def _update_parquet(store, run: str, parquet: Path) -> int:
    """RUN's rows SQL holds and the dataset lacks written (by key: exactly once), its snapshot
    tables rewritten, then its parts compacted. Returns rows written."""
    from steptail.storage.catchup import catch_up
    from steptail.storage.compact import compact
    from steptail.storage.parquet import ParquetError

    try:
        filled = catch_up(store, run, parquet)
        compact(parquet, run)
    except ParquetError as exc:
        fail(str(exc))
    except OSError as exc:  # a run folder that cannot be made
        fail(f"cannot write Parquet under {parquet}: {exc.strerror or exc}")
    return filled


def _update_lake(store, run: str, lake) -> dict:
    """RUN's rows SQL holds and the tables lack appended (exactly once), its snapshot tables
    replaced, then RUN's files of each table compacted (the old ones only marked removed)."""
    from steptail.storage.catchup import catch_up_lake
    from steptail.storage.lake import TABLES, LakeError

    try:
        added = catch_up_lake(store, run, lake)
        files = [lake.compact(table, run) for table in TABLES]
    except LakeError as exc:
        fail(str(exc))
    return {"location": lake.location.uri, "rows_added": added,
            "files_before": sum(b for b, _ in files), "files_after": sum(a for _, a in files)}
