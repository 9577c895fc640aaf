"""The collector's own faults (collector_events, migration 0012): each spell of a source
failing, kept as health beside the run, never as one of its findings. Written by `follow`
(collector.notify.collector_events), read by the API and the page."""

from __future__ import annotations

from functools import cache

import sqlalchemy as sa

from steptail.parsers import format_ns

COLUMNS = ("run", "kind", "source", "started_ns", "cleared_ns", "reason", "failures", "lost_steps")
LIMIT = 500  # newest events one read returns


def record_events(conn: sa.Connection, rows: list[tuple]) -> None:
    """rows: COLUMNS each; an event already stored (same run, source, start) is updated (it
    cleared, failed again, or lost steps since)."""
    if rows:
        conn.exec_driver_sql(_upsert_sql(conn.dialect.paramstyle), [_row(r) for r in rows])


def read_events(conn: sa.Connection, run: str | None = None, limit: int = LIMIT) -> list[dict]:
    """The newest events first: a run's own and pod discovery's (which blinded every run); all
    of them without `run`."""
    where, params = "", {"limit": limit}
    if run is not None:
        where, params["run"] = "WHERE run = :run OR run = ''", run
    rows = conn.execute(sa.text(
        f"SELECT {', '.join(COLUMNS)} FROM collector_events {where} "
        "ORDER BY started_ns DESC, id DESC LIMIT :limit"), params).all()
    return [as_dict(*r) for r in rows]


def as_dict(run: str, kind: str, source: str, started_ns: int, cleared_ns: int | None, reason: str,
            failures: int, lost_steps) -> dict:
    """One event as the API, the page and the follow summary show it."""
    return {"run": run or None, "kind": kind, "source": source, "started": format_ns(started_ns),
            "cleared": format_ns(cleared_ns) if cleared_ns is not None else None,
            "open": cleared_ns is None, "reason": reason, "failures": int(failures),
            "lost_steps": bool(lost_steps)}


def _row(r: tuple) -> tuple:
    run, kind, source, started, cleared, reason, failures, lost = r
    return (run or "", kind, source[:32], started, cleared, (reason or "")[:600], failures, bool(lost))


@cache
def _upsert_sql(paramstyle: str) -> str:
    marks = ", ".join(["?" if paramstyle == "qmark" else "%s"] * len(COLUMNS))
    return (f"INSERT INTO collector_events ({', '.join(COLUMNS)}) VALUES ({marks}) "
            "ON CONFLICT (run, source, started_ns) DO UPDATE SET kind = excluded.kind, "
            "cleared_ns = excluded.cleared_ns, reason = excluded.reason, failures = excluded.failures, "
            "lost_steps = excluded.lost_steps")
