"""Superseded findings (table superseded_findings, migration 0011): a stored finding that a newer
evaluation changed (its severity, or fewer steps) or no longer raises is
copied here first, with when, by which evaluation (check, ingest, reparse, follow) and why;
`findings` keeps the current ones. A range that merely grew, or words that changed with the
same severity (more evidence), are the same verdict, not superseded (`change`)."""

from __future__ import annotations

import logging
import time

import sqlalchemy as sa

from steptail.parsers import format_ns
from steptail.runs.findings import Finding, step_range
from steptail.runs.rows import FINDINGS
from steptail.storage.run_inputs import reference_document, reference_history, stored_reference

_log = logging.getLogger("steptail.findings")
COLUMNS = (*FINDINGS, "superseded_ns", "superseded_by", "why")


def change(old: Finding, new: Finding) -> str | None:
    """Why `new` (same key) supersedes the stored `old`, or None when the verdict stands. A
    verdict is a severity over steps: a new severity, or fewer steps, supersedes it; new words
    with the same severity over the same or more steps (a range grown, the follower's second
    evidence, another reference's figure: that change is kept in reference_ce) update it."""
    if new.severity != old.severity:
        return f"severity {old.severity} -> {new.severity}: {new.detail}"
    if new.last_step < old.last_step:
        return (f"{step_range(old.first_step, old.last_step)} -> "
                f"{step_range(new.first_step, new.last_step)}: {new.detail}")
    return None


def supersede(conn: sa.Connection, old: Finding, by: str, why: str) -> None:
    """Keep `old` as superseded (the caller then changes or deletes the current row)."""
    conn.execute(sa.text(
        f"INSERT INTO superseded_findings ({', '.join(COLUMNS)})"
        f" VALUES ({', '.join(':' + c for c in COLUMNS)})"),
        {**{c: getattr(old, c) for c in FINDINGS},
         "superseded_ns": time.time_ns(), "superseded_by": by, "why": why})
    _log.warning("%s: finding %s (%s) superseded by %s: %s", old.run, old.kind, old.severity, by, why)


def load_superseded(conn: sa.Connection, run: str) -> list[dict]:
    """The run's superseded findings, oldest supersession first."""
    rows = conn.execute(sa.text(
        f"SELECT {', '.join(COLUMNS)} FROM superseded_findings WHERE run = :run ORDER BY superseded_ns, id"),
        {"run": run})
    return [dict(r._mapping) for r in rows]


def superseded_count(conn: sa.Connection, run: str) -> int:
    return conn.execute(sa.text("SELECT COUNT(*) FROM superseded_findings WHERE run = :run"), {"run": run}).scalar()


def superseded_event(row: dict) -> dict:
    """A superseded finding as `check -o json` and the API show it: readable times."""
    out = {k: row[k] for k in ("kind", "incarnation", "first_step", "last_step", "detail", "severity")}
    return {"run": row["run"], **out, "detected_at": format_ns(row["detected_ns"]),
            "superseded_at": format_ns(row["superseded_ns"]), "superseded_by": row["superseded_by"],
            "why": row["why"]}


def verdict_history(conn: sa.Connection, run: str) -> dict:
    """What the API adds on request (?superseded=1): the superseded findings and the HF
    reference CE the run's gate is evaluated with (current and replaced)."""
    return {"superseded": [superseded_event(r) for r in load_superseded(conn, run)],
            "reference_ce": reference_document(stored_reference(conn, run)),
            "reference_ce_history": [
                {**r, "given_at": format_ns(r["given_ns"]),
                 "superseded_at": format_ns(r["superseded_ns"]) if r["superseded_ns"] else None}
                for r in reference_history(conn, run)]}
