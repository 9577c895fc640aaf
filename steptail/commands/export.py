"""`steptail export RUN --out DIR`: the ledger bundle of a run."""

from __future__ import annotations

from pathlib import Path

import click

from steptail.commands._common import db_option, fail, json_option, print_json, store_or_exit


@click.command()
@click.argument("run")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path),
              help="Directory to create (written elsewhere first, then renamed into place).")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@db_option
@json_option
def command(run: str, out: Path, force: bool, db: str | None, as_json: bool) -> None:
    """Export RUN for the experiment ledger: Parquet per table, manifest.json, ce.png."""
    from storage.export import ExportError, check_export_name, export_run

    try:
        check_export_name(run)
    except ExportError as exc:
        fail(str(exc))
    store = store_or_exit(db, create=False)
    try:
        manifest = export_run(store, run, out, force=force)
    except ExportError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror or exc}")
    if as_json:
        print_json({"out": str(out), "manifest": manifest})
    else:
        c = manifest["counts"]
        click.echo(f"exported {run} to {out}: {c['loss_parts']} loss rows, {c['required_rbf']}"
                   f" REQUIRED_RBF, {c['pod_metrics']} pod metrics, {c['findings']} findings,"
                   f" {c['incarnations']} incarnations")
