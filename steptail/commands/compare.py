"""`steptail compare ARM CONTROL`: CE of an arm against its control, step by step.

Exit 0 when every common step is within tolerance, 1 when the arm diverges, 2 when the
comparison is refused (different slice shapes, unknown runs, nothing in common) or fails."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click
from rich.markup import escape

from steptail.api import Steptail, UnknownRun
from steptail.commands._common import count, db_option, fail, store_or_exit
from steptail.output import Column, Output, output_option
from steptail.storage.compare import CompareRefused, Comparison, plot
from steptail.storage.db import StoreFailure

TABLE_ROWS = 200  # longer comparisons show a terminal the rows around the divergence; pipes get all


@click.command()
@click.argument("arm")
@click.argument("control")
@click.option("--tolerance", type=float, default=1e-3, show_default=True, metavar="ABS",
              help="Absolute tolerance on |arm ce - control ce|.")
@click.option("--rel", type=float, default=0.0, show_default=True, metavar="REL",
              help="Relative tolerance (x |control ce|), added to --tolerance.")
@click.option("--plot", "plot_path", metavar="F.png",
              help="Write a PNG of both curves (every step of each; missing steps, non-finite CE, restores"
                   " and the shorter run's end marked) and their difference, with the divergence point.")
@db_option
@output_option()
def command(arm: str, control: str, tolerance: float, rel: float, plot_path: str | None,
            db: str | None, output: Output) -> None:
    """Compare the CE of ARM with CONTROL at each step (latest incarnation's value per step)."""
    if not (tolerance >= 0 and rel >= 0):
        fail("--tolerance and --rel must be non-negative numbers")
    if plot_path is not None and not Path(plot_path).expanduser().absolute().parent.is_dir():
        fail(f"cannot write the plot: directory {Path(plot_path).parent} does not exist")
    store = store_or_exit(db, create=False)
    try:
        result = Steptail(store).comparison(arm, control, tolerance, rel)
    except UnknownRun as exc:
        fail(str(exc))
    except CompareRefused as exc:
        fail(f"comparison refused: {exc}")
    except StoreFailure as exc:
        _store_failed(store, exc)
    if plot_path is not None:
        try:
            plot(result, plot_path, store)
        except OSError as exc:
            fail(f"cannot write the plot {plot_path}: {exc.strerror or exc}")
        except StoreFailure as exc:  # the plot reads each run's gaps and restores
            _store_failed(store, exc)
    if output.machine:
        output.data({**result.summary(), "steps": result.rows}, result.rows)
    else:
        _print(output, result, plot_path)
    sys.exit(1 if result.first_divergent_step is not None else 0)


def _store_failed(store, exc: StoreFailure) -> NoReturn:
    fail(f"cannot read {store.describe()}: {str(getattr(exc, 'orig', exc)).splitlines()[0]}")


def _shown(result: Comparison) -> list[dict]:
    rows = result.rows
    if len(rows) <= TABLE_ROWS:
        return rows
    first = result.first_divergent_step
    start = 0 if first is None else max(0, next(i for i, r in enumerate(rows) if r["step"] == first) - 10)
    return rows[start:start + TABLE_ROWS]


def _ce(value: float | None) -> str:
    return "nan/inf" if value is None else f"{value:.6f}"


COLUMNS = [
    Column("step", "step"),
    Column("arm ce", lambda r: _ce(r["arm_ce"])),
    Column("control ce", lambda r: _ce(r["control_ce"])),
    Column("\u0394ce", lambda r: None if r["delta"] is None else f"{r['delta']:+.6f}"),
    Column("beyond", lambda r: "beyond" if r["beyond"] else None, style=lambda r: "bold red"),
]


def _print(output: Output, result: Comparison, plot_path: str | None) -> None:
    s = result.summary()
    rows = result.rows if output.piped else _shown(result)  # a pipe gets every row
    output.table(COLUMNS, rows, title=f"{result.arm} vs {result.control}")
    if len(rows) < len(result.rows):
        output.line(f"({len(rows)} of {count(len(result.rows), 'step')} shown; --json prints all)")
    mx = "n/a" if s["max_abs_delta"] is None else f"{s['max_abs_delta']:.6f} at step {s['max_delta_step']}"
    output.line(f"{count(s['steps_compared'], 'common step')} on {count(s['process_count'], 'process', 'processes')}; "
                f"max |\u0394ce| {mx}; tolerance {result.tolerance:g} + {result.rel:g} x |control|")
    if s["only_arm"] or s["only_control"]:
        output.line(f"steps only in {result.arm}: {s['only_arm']}; only in {result.control}: {s['only_control']}")
    first = s["first_divergent_step"]
    output.line("within tolerance" if first is None else
                f"[bold red]diverges at step {first}[/] ({count(s['divergent_steps'], 'step')} beyond tolerance)")
    st = result.step_time
    if st is not None:
        words = (f"median step time {st['median_step_s']:.2f} s vs control's {st['control_median_step_s']:.2f} s"
                 f" ({st['ratio']:.2f}x)")
        if st["severity"] is None:
            output.line(words)
        else:
            color = "bold red" if st["severity"] == "critical" else "bold yellow"
            output.line(f"[{color}]step_time_regression ({st['severity']})[/]: {escape(st['detail'])}")
    if plot_path:
        output.line(f"plot: {plot_path}")
