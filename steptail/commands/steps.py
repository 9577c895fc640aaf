"""`steptail steps RUN`: one row per (incarnation, step) in log order."""

from __future__ import annotations

import click

from steptail.commands._common import db_option, fail, store_or_exit
from steptail.output import Column, output_option
from steptail.storage.flat import StepColumns
from steptail.storage.reads import iter_steps, run_exists

# On a terminal the step's identity and its CE stay whole; the program is cut first, then
# columns are left out: -o wide's layers, its parts (from the right), the program, the time.
COLUMNS = [
    Column("inc", "incarnation", keep=True),
    Column("step", "step", keep=True),
    Column("time", "ts", age=True, min_width=None, drop=1),
    Column("ce", "ce_raw", keep=True),
    Column("rbf max", lambda r: None if r["rbf_max"] is None else f"{r['rbf_max']:.4f}", min_width=None),
    Column("program", "rbf_program", min_width=6, drop=2),
]


def wide_columns(flat: StepColumns) -> list[Column]:
    """-o wide's: one per loss part and one per REQUIRED_RBF layer, named as in -o csv."""
    parts = [Column(name, lambda r, key=key: (r.get("parts") or {}).get(key), wide=True, min_width=None, drop=3)
             for key, name in flat.parts.items()]
    layers = [Column(name, lambda r, i=i: _layer(r, i), wide=True, min_width=None, drop=4)
              for i, name in enumerate(flat.layer_names)]
    return parts + layers


def _layer(row: dict, i: int):
    layers = row.get("rbf_per_layer") or []
    return layers[i] if i < len(layers) else None


@click.command()
@click.argument("run")
@click.option("--from", "lo", type=int, help="First step to show.")
@click.option("--to", "hi", type=int, help="Last step to show.")
@db_option
@output_option(csv_flag=True)
def command(run: str, lo: int | None, hi: int | None, db: str | None, output) -> None:
    """Show the recorded steps of RUN (ce, other loss parts, REQUIRED_RBF).

    -o wide and -o csv have one column per loss part (z_loss, moe_lb, ...: as logged,
    `parts.<key>` for a key named like another column) and one per REQUIRED_RBF layer
    (rbf_layer_0, rbf_layer_1, ...); -o json and -o ndjson keep `parts` and `rbf_per_layer`
    nested."""
    store = store_or_exit(db, create=False)
    if not run_exists(store, run):
        fail(f"no run {run!r} in {store.describe()}")
    rows = iter_steps(store, run, lo, hi)
    if output.format == "ndjson":
        output.data(None, rows)  # streamed: a long run is never held whole
    elif output.format == "csv":
        records = list(rows)
        flat = StepColumns(records)
        output.data(None, [flat.flat(r) for r in records], flat.names)
    elif output.machine:
        output.data(list(rows))
    elif output.format == "wide":
        records = list(rows)
        output.table(COLUMNS + wide_columns(StepColumns(records)), records)
    else:
        output.table(COLUMNS, rows)
