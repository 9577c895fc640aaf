"""How the store and its runs stand: a health ping, the gauges `serve` exposes at /metrics,
and what the demo reports of each run it followed."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from steptail.storage.db import Store


def reachable(store: Store) -> bool:
    """Whether the store answers a query now."""
    try:
        with store.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.SQLAlchemyError:
        return False
    return True


_GAUGES = """
WITH recent AS (
  SELECT run FROM runs WHERE updated_ns >= :since ORDER BY updated_ns DESC, run LIMIT :limit
)
SELECT r.run,
  (SELECT s.hi FROM loss_summary s WHERE s.run = r.run ORDER BY s.incarnation DESC LIMIT 1) AS last_step,
  (SELECT MAX(s.last_ts_ns) FROM loss_summary s WHERE s.run = r.run) AS last_ts,
  (SELECT CAST(COALESCE(SUM(s.steps), 0) AS BIGINT) FROM loss_summary s WHERE s.run = r.run) AS steps,
  (SELECT COUNT(*) FROM findings f WHERE f.run = r.run) AS findings
FROM recent r ORDER BY r.run
"""  # from loss_summary (kept at commit): a scrape costs the same on day 1 and day 100


def run_gauges(store: Store, since_ns: int = 0, limit: int = 2**31 - 1) -> tuple[int, list[tuple]]:
    """(runs in the store, [(run, last_step, last_ts_ns, steps, findings)]) of the at most
    `limit` runs most recently updated, none updated before `since_ns`, by name; the last
    step is the latest incarnation's."""
    with store.engine.connect() as conn:
        total = conn.execute(sa.text("SELECT COUNT(*) FROM runs")).scalar()
        rows = [tuple(r) for r in conn.execute(sa.text(_GAUGES), {"since": since_ns, "limit": limit})]
    return total, rows


def last_recorded(store: Store, run: str) -> tuple[int, int | None] | None:
    """(step, ts_ns) of the run's last LOSS-PARTS row (its latest incarnation's), or None."""
    with store.engine.connect() as conn:
        row = conn.execute(sa.text("SELECT step, ts_ns FROM loss_parts WHERE run = :r"
                                   " ORDER BY incarnation DESC, step DESC LIMIT 1"), {"r": run}).first()
    return None if row is None else (row[0], row[1])


@dataclass
class Recorded:
    steps: int  # LOSS-PARTS rows
    incarnations: int
    stream_gaps: list[tuple]  # (stream, start_ns, end_ns, reason), by start
    findings: list[tuple]  # (kind, incarnation, first_step, last_step, severity, detail), as stored


def recorded(store: Store, runs: list[str]) -> dict[str, Recorded]:
    """What the store holds of each of `runs`."""
    out = {}
    with store.engine.connect() as c:
        for run in runs:
            q = {"r": run}
            out[run] = Recorded(
                steps=c.execute(sa.text("SELECT COUNT(*) FROM loss_parts WHERE run=:r"), q).scalar(),
                incarnations=c.execute(sa.text("SELECT COUNT(*) FROM incarnations WHERE run=:r"), q).scalar(),
                stream_gaps=[tuple(r) for r in c.execute(sa.text(
                    "SELECT stream, start_ns, end_ns, reason FROM stream_gaps WHERE run=:r ORDER BY start_ns"), q)],
                findings=[tuple(r) for r in c.execute(sa.text(
                    "SELECT kind, incarnation, first_step, last_step, severity, detail FROM findings"
                    " WHERE run=:r ORDER BY id"), q)],
            )
    return out
