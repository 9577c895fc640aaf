"""`steptail runs`: the runs in the store."""

from __future__ import annotations

import click

from steptail.commands._common import db_option, store_or_exit
from steptail.output import Column, output_option
from steptail.storage.reads import list_runs

# On a terminal the run's name stays whole; the source is cut first, then columns are left
# out: the wide ones, bad lines, the source, the last line's age (steptail.output.fit).
COLUMNS = [
    Column("run", "run", keep=True),
    Column("state", "state", keep=True),
    Column("source", lambda r: ", ".join(r["sources"]), min_width=8, drop=2),
    Column("incarnations", "incarnations", min_width=None, short="incs"),
    Column("steps", "steps", min_width=None),
    Column("last step", "last_step", min_width=None),
    Column("last ce", lambda r: None if r["last_ce"] is None else f"{r['last_ce']:.6f}", min_width=None),
    Column("last line", "last_ts", age=True, min_width=None, drop=1),
    Column("bad lines", "bad_lines", min_width=None, drop=3),
    Column("jobset", "jobset", wide=True, drop=4),
    Column("namespace", "namespace", wide=True, drop=4),
    Column("max step", "max_step", wide=True, min_width=None, drop=4),
    Column("updated", "updated", wide=True, age=True, min_width=None, drop=4),
]


@click.command()
@db_option
@output_option()
def command(db: str | None, output) -> None:
    """List recorded runs: state (live, stalled, ended, failed, ingested, unknown), source
    (kubernetes:<namespace>/<jobset> or files), incarnations, steps, last step and CE."""
    store = store_or_exit(db, create=False)
    runs = list_runs(store)
    if output.machine:
        output.data(runs)
    elif runs or output.piped:
        output.table(COLUMNS, runs)
    else:
        output.line("no runs recorded yet")
