"""A run's goodput (docs/goodput.md) from what the store holds: its incarnations, each
LOSS-PARTS step with its `completed step` figures, its checkpoint saves, fed to
runs.goodput.RunTiming — the one computation every path shares."""

from __future__ import annotations

import sqlalchemy as sa

from steptail.runs.goodput import RunTiming
from steptail.storage.db import Store
from steptail.storage.reads import known_run

_INCARNATIONS = sa.text("SELECT incarnation, started_ns FROM incarnations WHERE run = :run")
_STEPS = sa.text(
    "SELECT l.incarnation, l.step, l.ts_ns, p.seconds, p.tflops, p.tokens_per_s FROM loss_parts l"
    " LEFT JOIN pod_metrics p ON p.run = l.run AND p.incarnation = l.incarnation AND p.step = l.step"
    " WHERE l.run = :run")
_SAVES = sa.text("SELECT incarnation, step, ts_ns FROM checkpoints WHERE run = :run AND kind = 'save'")


def timing_on(conn: sa.Connection, run: str) -> RunTiming:
    """The run's RunTiming, fed from the rows on `conn`."""
    timing, p = RunTiming(run), {"run": run}
    for inc, started in conn.execute(_INCARNATIONS, p):
        timing.incarnation(inc, started)
    timing.add_steps(conn.execute(_STEPS, p).fetchall())  # fetchall: a row at a time costs twice as much
    for inc, s, ts in conn.execute(_SAVES, p):
        timing.save(inc, s, ts)
    return timing


def run_goodput(store: Store, run: str) -> dict:
    """The figures of `steptail goodput RUN -o json`; UnknownRun for no such run."""
    known_run(store, run)
    with store.engine.connect() as conn:
        return timing_on(conn, run).report()
