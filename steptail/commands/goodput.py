"""`steptail goodput RUN`: where the run's wall time went, and each incarnation's step time."""

from __future__ import annotations

import click

from steptail.commands._common import db_option, fail, store_or_exit
from steptail.output import Column, output_option
from steptail.storage.goodput import run_goodput
from steptail.storage.reads import UnknownRun

PARTS = ("productive_s", "replayed_s", "recovery_s", "checkpoint_s", "other_s")


def _s(value) -> str | None:
    return None if value is None else f"{value:.1f}"


def _f(key: str, fmt: str = "{:.3f}"):
    return lambda r: None if r.get(key) is None else fmt.format(r[key])


SPLIT = [
    Column("time", "what", keep=True),
    Column("seconds", lambda r: _s(r["seconds"]), keep=True),
    Column("share", lambda r: None if r["share"] is None else f"{100 * r['share']:.1f}%"),
]
INCARNATIONS = [
    Column("inc", "incarnation", keep=True),
    Column("steps", "steps"),
    Column("median step s", _f("median_step_s"), keep=True),
    Column("mad s", _f("step_s_mad")),
    Column("tokens/s/device", _f("tokens_per_s_device", "{:.1f}")),
    Column("tflop/s/device", _f("tflops_per_device", "{:.2f}")),
]
RESTARTS = [
    Column("inc", "incarnation", keep=True),
    Column("recovery s", lambda r: _s(r["recovery_s"]), keep=True),
    Column("queued s", lambda r: _s(r["queued_s"])),
    Column("down s", lambda r: _s(r["down_s"])),
    Column("startup s", lambda r: _s(r["startup_s"])),
    Column("compile s", lambda r: _s(r["compile_s"])),
]


@click.command()
@click.argument("run")
@db_option
@output_option()
def command(run: str, db: str | None, output) -> None:
    """Where RUN's wall time went: productive, replayed, recovery, checkpoint and other
    seconds, goodput = productive / wall, each restart's recovery and each incarnation's
    median step time, its MAD, tokens/s/device and TFLOP/s/device (docs/goodput.md).

    A log without kubelet timestamps has no wall time: wall, other and goodput are null.

    \b
    Examples:
      steptail goodput resume-gap
      steptail goodput resume-gap -o json
    """
    store = store_or_exit(db, create=False)
    try:
        g = run_goodput(store, run)
    except UnknownRun as exc:
        fail(str(exc))
    if output.machine:
        output.data(g, g["incarnations"])
        return
    wall = g["wall_s"]
    share = "unknown" if g["goodput"] is None else f"{100 * g['goodput']:.1f}%"
    wall_text = "unknown (no timestamps)" if wall is None else f"{wall:.1f} s"
    output.line(f"run {run}: wall {wall_text}, goodput {share}", markup=False)
    output.table(SPLIT, [{"what": k[:-2], "seconds": g[k], "share": None if not wall or g[k] is None else g[k] / wall}
                         for k in PARTS])
    output.table(INCARNATIONS, g["incarnations"])
    if g["restarts"]:
        output.table(RESTARTS, g["restarts"])
