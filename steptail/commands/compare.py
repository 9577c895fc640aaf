"""`steptail compare ARM CONTROL`: CE of an arm against its control, step by step.

Exit 0 when every common step is within tolerance, 1 when the arm diverges, 2 when the
comparison is refused (different slice shapes, unknown runs, nothing in common) or fails."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError

from steptail.commands._common import db_option, fail, json_option, print_json, store_or_exit
from steptail.findings.compare import CompareRefused, Comparison, compare_runs, plot
from storage.reads import run_exists

TABLE_ROWS = 200  # longer comparisons print the rows around the divergence; --json has all


@click.command()
@click.argument("arm")
@click.argument("control")
@click.option("--tolerance", type=float, default=1e-3, show_default=True, metavar="ABS",
              help="Absolute tolerance on |arm ce - control ce|.")
@click.option("--rel", type=float, default=0.0, show_default=True, metavar="REL",
              help="Relative tolerance (x |control ce|), added to --tolerance.")
@click.option("--plot", "plot_path", metavar="F.png", help="Write a PNG of both curves and the divergence point.")
@db_option
@json_option
def command(arm: str, control: str, tolerance: float, rel: float, plot_path: str | None,
            db: str | None, as_json: bool) -> None:
    """Compare the CE of ARM with CONTROL at each step (latest incarnation's value per step)."""
    if not (tolerance >= 0 and rel >= 0):
        fail("--tolerance and --rel must be non-negative numbers")
    if plot_path is not None and not Path(plot_path).expanduser().absolute().parent.is_dir():
        fail(f"cannot write the plot: directory {Path(plot_path).parent} does not exist")
    store = store_or_exit(db, create=False)
    for run in (arm, control):
        if not run_exists(store, run):
            fail(f"no run {run!r} in {store.describe()}")
    try:
        result = compare_runs(store, arm, control, tolerance, rel)
    except CompareRefused as exc:
        fail(f"comparison refused: {exc}")
    except SQLAlchemyError as exc:
        fail(f"cannot read {store.describe()}: {str(getattr(exc, 'orig', exc)).splitlines()[0]}")
    if plot_path is not None:
        try:
            plot(result, plot_path)
        except OSError as exc:
            fail(f"cannot write the plot {plot_path}: {exc.strerror or exc}")
    if as_json:
        print_json({**result.summary(), "steps": result.rows})
    else:
        _print(result, plot_path)
    sys.exit(1 if result.first_divergent_step is not None else 0)


def _shown(result: Comparison) -> list[dict]:
    rows = result.rows
    if len(rows) <= TABLE_ROWS:
        return rows
    first = result.first_divergent_step
    start = 0 if first is None else max(0, next(i for i, r in enumerate(rows) if r["step"] == first) - 10)
    return rows[start:start + TABLE_ROWS]


def _ce(value: float | None) -> str:
    return "nan/inf" if value is None else f"{value:.6f}"


def _print(result: Comparison, plot_path: str | None) -> None:
    console = Console()
    s = result.summary()
    rows = _shown(result)
    table = Table("step", "arm ce", "control ce", "\u0394ce", "", title=f"{result.arm} vs {result.control}")
    for r in rows:
        delta = "" if r["delta"] is None else f"{r['delta']:+.6f}"
        table.add_row(str(r["step"]), _ce(r["arm_ce"]), _ce(r["control_ce"]), delta,
                      "[bold red]beyond[/]" if r["beyond"] else "")
    console.print(table)
    if len(rows) < len(result.rows):
        console.print(f"({len(rows)} of {len(result.rows)} steps shown; --json prints all)")
    mx = "n/a" if s["max_abs_delta"] is None else f"{s['max_abs_delta']:.6f} at step {s['max_delta_step']}"
    console.print(f"{s['steps_compared']} common steps on {s['process_count']} processes; "
                  f"max |\u0394ce| {mx}; tolerance {result.tolerance:g} + {result.rel:g} x |control|")
    if s["only_arm"] or s["only_control"]:
        console.print(f"steps only in {result.arm}: {s['only_arm']}; only in {result.control}: {s['only_control']}")
    first = s["first_divergent_step"]
    console.print("within tolerance" if first is None else
                  f"[bold red]diverges at step {first}[/] ({s['divergent_steps']} steps beyond tolerance)")
    if plot_path:
        console.print(f"plot: {plot_path}")
