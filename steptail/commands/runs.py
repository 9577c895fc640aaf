"""`steptail runs`: the runs in the store."""

from __future__ import annotations

import click

from steptail.commands._common import db_option, store_or_exit
from steptail.output import Column, output_option
from steptail.storage.reads import list_runs

COLUMNS = [
    Column("run", "run"),
    Column("source", lambda r: ", ".join(r["sources"])),
    Column("incarnations", "incarnations"),
    Column("steps", "steps"),
    Column("last step", "last_step"),
    Column("last ce", lambda r: None if r["last_ce"] is None else f"{r['last_ce']:.6f}"),
    Column("last line", "last_ts"),
    Column("bad lines", "bad_lines"),
    Column("jobset", "jobset", wide=True),
    Column("namespace", "namespace", wide=True),
    Column("max step", "max_step", wide=True),
    Column("updated", "updated", wide=True),
]


@click.command()
@db_option
@output_option()
def command(db: str | None, output) -> None:
    """List recorded runs: source (kubernetes:<namespace>/<jobset> or files), incarnations,
    steps, last step and CE."""
    store = store_or_exit(db, create=False)
    runs = list_runs(store)
    if output.machine:
        output.data(runs)
    elif runs or output.piped:
        output.table(COLUMNS, runs)
    else:
        output.line("no runs recorded yet")
