"""A run's goodput (docs/goodput.md) from what the store holds: its incarnations, each
LOSS-PARTS step with its `completed step` figures, its checkpoint saves, fed to
runs.goodput.RunTiming — the one computation every path shares."""

from __future__ import annotations

import time
from collections.abc import Callable

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


class GoodputCache:
    """Each run's report for the /metrics gauges, computed again only when the run's rows changed
    (its step count or last stamp: what run_gauges reads from loss_summary) and then at most every
    `every_s` seconds: a scrape costs nothing for runs that did not move, and a live run's cost
    is bounded by the interval, not by how often it is scraped."""

    def __init__(self, store: Store, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.every_s, self.clock = store, every_s, clock
        self._reports: dict[str, tuple[tuple, float, dict]] = {}

    def get(self, run: str, state: tuple) -> dict:
        """The run's report; `state` tells whether its rows changed since it was computed."""
        known = self._reports.get(run)
        now = self.clock()
        if known is not None and (known[0] == state or now - known[1] < self.every_s):
            return known[2]
        with self.store.engine.connect() as conn:
            report = timing_on(conn, run).report()
        self._reports[run] = (state, now, report)
        return report

    def keep(self, runs: set[str]) -> None:
        """Forget the runs no longer asked for (the gauges' runs are bounded; so is this)."""
        for run in set(self._reports) - runs:
            del self._reports[run]
