"""`steptail runs`: the runs in the store."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from steptail.commands._common import db_option, json_option, print_json, store_or_exit
from storage.reads import list_runs


@click.command()
@db_option
@json_option
def command(db: str | None, as_json: bool) -> None:
    """List recorded runs: source (kubernetes:<namespace>/<jobset> or files), incarnations,
    steps, last step and CE."""
    store = store_or_exit(db, create=False)
    runs = list_runs(store)
    if as_json:
        print_json(runs)
        return
    table = Table("run", "source", "incarnations", "steps", "last step", "last ce", "last line", "bad lines")
    for r in runs:
        ce = "" if r["last_ce"] is None else f"{r['last_ce']:.6f}"
        table.add_row(r["run"], ", ".join(r["sources"]), str(r["incarnations"]), str(r["steps"]),
                      str(r["last_step"] or ""), ce, r["last_ts"] or "", str(r["bad_lines"]))
    Console().print(table if runs else "no runs recorded yet")
