"""`steptail steps RUN`: one row per (incarnation, step) in log order."""

from __future__ import annotations

import click

from steptail.commands._common import db_option, fail, store_or_exit
from steptail.output import Column, output_option
from steptail.storage.reads import iter_steps, run_exists

COLUMNS = [
    Column("inc", "incarnation"),
    Column("step", "step"),
    Column("time", "ts"),
    Column("ce", "ce_raw"),
    Column("rbf max", lambda r: None if r["rbf_max"] is None else f"{r['rbf_max']:.4f}"),
    Column("program", "rbf_program"),
    Column("parts", "parts", wide=True),
    Column("rbf per layer", "rbf_per_layer", wide=True),
]


@click.command()
@click.argument("run")
@click.option("--from", "lo", type=int, help="First step to show.")
@click.option("--to", "hi", type=int, help="Last step to show.")
@db_option
@output_option(csv_flag=True)
def command(run: str, lo: int | None, hi: int | None, db: str | None, output) -> None:
    """Show the recorded steps of RUN (ce, other loss parts, REQUIRED_RBF)."""
    store = store_or_exit(db, create=False)
    if not run_exists(store, run):
        fail(f"no run {run!r} in {store.describe()}")
    rows = iter_steps(store, run, lo, hi)
    if output.format == "ndjson":
        output.data(None, rows)  # streamed: a long run is never held whole
    elif output.machine:
        output.data(list(rows))
    else:
        output.table(COLUMNS, rows)
