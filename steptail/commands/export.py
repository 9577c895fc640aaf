"""`steptail export RUN --out DIR`: the ledger bundle of a run."""

from __future__ import annotations

from pathlib import Path

import click

from steptail.commands._common import db_option, fail, store_or_exit
from steptail.output import Output, output_option


@click.command()
@click.argument("run")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path),
              help="Directory to create, and its missing parents (written elsewhere first, then renamed into place).")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@click.option("--parquet", metavar="DIR", type=click.Path(path_type=Path),
              help="Also bring RUN's Parquet dataset under DIR up to date: its parts compacted to one file"
                   " per table, its findings, stream gaps and reconnects written.")
@db_option
@output_option()
def command(run: str, out: Path, force: bool, parquet: Path | None, db: str | None, output: Output) -> None:
    """Export RUN for the experiment ledger: Parquet per table, manifest.json, ce.png."""
    from steptail.api import Steptail, UnknownRun
    from steptail.storage.export import ExportError, check_export_name

    try:
        check_export_name(run)
    except ExportError as exc:
        fail(str(exc))
    if parquet is not None and not parquet.is_dir():
        fail(f"Parquet directory {parquet} does not exist")
    store = store_or_exit(db, create=False)
    try:
        manifest = Steptail(store).export(run, out, force=force)
    except (ExportError, UnknownRun) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror or exc}")
    if parquet is not None:
        _update_parquet(store, run, parquet)
    if output.machine:
        output.data({"out": str(out), "manifest": manifest})
    else:
        c = manifest["counts"]
        click.echo(f"exported {run} to {out}: {c['loss_parts']} loss rows, {c['required_rbf']}"
                   f" REQUIRED_RBF, {c['pod_metrics']} pod metrics, {c['findings']} findings,"
                   f" {c['incarnations']} incarnations")


def _update_parquet(store, run: str, parquet: Path) -> None:
    from steptail.storage.compact import compact, write_snapshots
    from steptail.storage.parquet import ParquetError

    try:
        write_snapshots(store, run, parquet)
        compact(parquet, run)
    except ParquetError as exc:
        fail(str(exc))
