"""A run's evaluation inputs, stored with the run (table reference_ce, migration 0011): the HF
reference CE of the step-1 gate as it was given once (its source: the file, or the value on the
command line), so that a later `check`, `reparse`, `follow` or `ingest` given none uses it, and
the export carries it. A different reference given later becomes the current one; the old rows
stay, marked superseded (when, by which evaluation)."""

from __future__ import annotations

import logging
import time

import sqlalchemy as sa

from steptail.runs.reference import Reference

_log = logging.getLogger("steptail.findings")

GIVEN = "given on the command line"  # the source of a reference handed over without one


def stored_reference(conn: sa.Connection, run: str) -> Reference | None:
    """The run's current reference (None: never given)."""
    rows = conn.execute(sa.text(
        "SELECT step, ce, source FROM reference_ce WHERE run = :run AND superseded_ns IS NULL"
        " ORDER BY step, id"), {"run": run}).all()
    if not rows:
        return None
    sources = list(dict.fromkeys(r[2] for r in rows))
    return Reference({r[0]: r[1] for r in rows}, "; ".join(sources))


def remember_reference(conn: sa.Connection, run: str, given: dict[int, float] | None, by: str) -> Reference | None:
    """The reference an evaluation of `run` uses: the one given (stored when it differs from the
    stored one, whose rows are then marked superseded), else the stored one; None when neither.
    The same values given again write nothing (the first source is kept)."""
    stored = stored_reference(conn, run)
    if not given:
        return stored
    if stored is not None and dict(stored) == dict(given):
        return stored
    now = time.time_ns()
    source = getattr(given, "source", None) or GIVEN
    if stored is not None:
        conn.execute(sa.text(
            "UPDATE reference_ce SET superseded_ns = :now, superseded_by = :by"
            " WHERE run = :run AND superseded_ns IS NULL"), {"run": run, "now": now, "by": by})
    conn.execute(sa.text(
        "INSERT INTO reference_ce (run, step, ce, source, given_ns, given_by)"
        " VALUES (:run, :step, :ce, :source, :now, :by)"),
        [{"run": run, "step": int(s), "ce": float(ce), "source": source, "now": now, "by": by}
         for s, ce in sorted(given.items())])
    if stored is None:
        _log.info("%s: HF reference CE stored with the run (from %s, by %s)", run, source, by)
    else:
        _log.warning("%s: HF reference CE replaced by %s (from %s; was from %s)", run, by, source, stored.source)
    return Reference(dict(given), source)


def describe(reference: dict[int, float] | None) -> str:
    """The evaluation's input, for the `why` of a superseded finding."""
    if not reference:
        return "without an HF reference CE"
    steps = ", ".join(f"step {s}: {ce:.6f}" for s, ce in sorted(reference.items())[:3])
    more = f" and {len(reference) - 3} more" if len(reference) > 3 else ""
    source = getattr(reference, "source", None) or GIVEN
    return f"with the HF reference CE {steps}{more} (from {source})"


def reference_history(conn: sa.Connection, run: str) -> list[dict]:
    """Every reference row of the run, current ones first (superseded: null), for the API and
    the export."""
    rows = conn.execute(sa.text(
        "SELECT step, ce, source, given_ns, given_by, superseded_ns, superseded_by FROM reference_ce"
        " WHERE run = :run ORDER BY superseded_ns IS NOT NULL, superseded_ns DESC, step, id"), {"run": run})
    return [dict(r._mapping) for r in rows]


def copy_reference(conn: sa.Connection, src: str, dst: str) -> None:
    """A run rebuilt from `src` (reparse --into) is evaluated with `src`'s current reference."""
    conn.execute(sa.text(
        "INSERT INTO reference_ce (run, step, ce, source, given_ns, given_by)"
        " SELECT :dst, step, ce, source, given_ns, given_by FROM reference_ce"
        " WHERE run = :src AND superseded_ns IS NULL"), {"src": src, "dst": dst})


def reference_document(reference: Reference | None) -> dict | None:
    """The current reference as `check -o json`, the API and the export's manifest show it."""
    if not reference:
        return None
    return {"ce": {str(s): ce for s, ce in sorted(reference.items())}, "source": reference.source}
