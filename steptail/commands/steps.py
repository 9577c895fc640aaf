"""`steptail steps RUN`: one row per (incarnation, step) in log order."""

from __future__ import annotations

import csv
import json
import sys

import click
from rich.console import Console
from rich.table import Table

from steptail.commands._common import db_option, fail, print_json, store_or_exit
from storage.reads import iter_steps, run_exists


@click.command()
@click.argument("run")
@click.option("--from", "lo", type=int, help="First step to show.")
@click.option("--to", "hi", type=int, help="Last step to show.")
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV.")
def command(run: str, lo: int | None, hi: int | None, db: str | None, as_json: bool, as_csv: bool) -> None:
    """Show the recorded steps of RUN (ce, other loss parts, REQUIRED_RBF)."""
    if as_json and as_csv:
        fail("--json and --csv exclude each other")
    store = store_or_exit(db, create=False)
    if not run_exists(store, run):
        fail(f"no run {run!r} in {store.describe()}")
    rows = iter_steps(store, run, lo, hi)
    if as_json:
        print_json(list(rows))
    elif as_csv:
        out = csv.writer(sys.stdout)
        out.writerow(["incarnation", "step", "ts", "ce", "ce_raw", "parts", "rbf_max",
                      "rbf_per_layer", "rbf_program"])
        for r in rows:
            out.writerow([r["incarnation"], r["step"], r["ts"] or "", r["ce_raw"] or "",
                          r["ce_raw"] or "", json.dumps(r["parts"]), r["rbf_max"] or "",
                          json.dumps(r["rbf_per_layer"]) if r["rbf_per_layer"] else "",
                          r["rbf_program"] or ""])
    else:
        table = Table("inc", "step", "time", "ce", "rbf max", "program")
        for r in rows:
            table.add_row(str(r["incarnation"]), str(r["step"]), r["ts"] or "", r["ce_raw"] or "",
                          "" if r["rbf_max"] is None else f"{r['rbf_max']:.4f}", r["rbf_program"] or "")
        Console().print(table)
