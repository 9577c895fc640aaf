"""What the collector saw of a run's end (runs.outcome: completed or failed, when, why) and its
heartbeat (runs.followed_ns: "I follow this run now"), and each run's state from them
(steptail.runs.state.decide: the one definition the page, `runs`, the API, `check` and the
dashboards share).

The facts cost the number of runs and incarnations, never the steps: the last step's stamp
and the step time come from loss_summary (kept at each commit, storage.summary)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import sqlalchemy as sa

from steptail.runs.state import OUTCOMES, STALL_K, Facts, RunState, decide, step_seconds
from steptail.storage.db import Store
from steptail.storage.sources import FILES

log = logging.getLogger("steptail.store")

# when it ended is kept when only the reason grows (e.g. "being archived" -> "archived")
_RECORD = ("UPDATE runs SET outcome_ns = CASE WHEN outcome = :outcome AND outcome_ns IS NOT NULL"
           " THEN outcome_ns ELSE :at END, outcome = :outcome, outcome_reason = :reason"
           " WHERE run = :run AND (outcome IS NULL OR outcome <> :outcome OR outcome_reason IS NULL"
           " OR outcome_reason <> :reason)")
_BEAT = sa.text("UPDATE runs SET followed_ns = :now WHERE run IN :runs RETURNING run").bindparams(
    sa.bindparam("runs", expanding=True))
_RUNS = "SELECT run, outcome, outcome_ns, outcome_reason, followed_ns FROM runs"
_SOURCES = "SELECT run, source FROM run_sources"
_SUMMARY = "SELECT run, incarnation, lo, hi, first_ts_ns, last_ts_ns FROM loss_summary ORDER BY run, incarnation"


def record(store: Store, run: str, outcome: str, reason: str, now_ns: int | None = None) -> bool | None:
    """Store the run's end as the collector saw it (the first time, or when it changed): True
    if written, False if already so, None if the run has no row yet (nothing of it committed:
    the caller tries again later)."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {OUTCOMES}, not {outcome!r}")
    with store.engine.begin() as conn:
        n = conn.execute(sa.text(_RECORD), {"run": run, "outcome": outcome, "reason": reason[:1000],
                                            "at": now_ns if now_ns is not None else time.time_ns()}).rowcount
        if not n and conn.execute(sa.text("SELECT 1 FROM runs WHERE run = :run"), {"run": run}).first() is None:
            return None
    return bool(n)


def heartbeat(store: Store, runs: Iterable[str], now_ns: int | None = None) -> set[str]:
    """The collector follows `runs` now (runs.followed_ns): one statement for all of them.
    Returns those that had a row to mark (a run with nothing committed yet has none)."""
    now = now_ns if now_ns is not None else time.time_ns()
    names = sorted(set(runs))
    if not names:
        return set()
    with store.engine.begin() as conn:
        return {r for (r,) in conn.execute(_BEAT, {"runs": names, "now": now})}


def facts(conn: sa.Connection, run: str | None = None) -> dict[str, Facts]:
    """run -> Facts, of every run (or of `run`)."""
    where, p = (" WHERE run = :run", {"run": run}) if run is not None else ("", {})
    clustered: set[str] = set()
    for r, source in conn.execute(sa.text(_SOURCES + where), p):
        if source != FILES:
            clustered.add(r)
    spans: dict[str, list[tuple]] = {}
    summary = _SUMMARY if run is None else _SUMMARY.replace(" ORDER BY", " WHERE run = :run ORDER BY")
    for r, _inc, lo, hi, t0, t1 in conn.execute(sa.text(summary), p):
        spans.setdefault(r, []).append((lo, hi, t0, t1))
    out = {}
    for r, outcome, outcome_ns, reason, followed in conn.execute(sa.text(_RUNS + where), p):
        incs = spans.get(r, [])
        last = max((t1 for *_, t1 in incs if t1 is not None), default=None)
        # the latest incarnation's pace, else the last one that had two stamped steps
        pace = next((s for s in (step_seconds(t0, t1, lo, hi) for lo, hi, t0, t1 in reversed(incs))
                     if s is not None), None)
        out[r] = Facts(from_cluster=r in clustered, outcome=outcome, outcome_ns=outcome_ns,
                       outcome_reason=reason, followed_ns=followed, last_step_ns=last, step_seconds=pace)
    return out


def states(conn: sa.Connection, now_ns: int | None = None, k: float = STALL_K) -> dict[str, RunState]:
    """run -> RunState of every run, now."""
    now = now_ns if now_ns is not None else time.time_ns()
    return {r: decide(f, now, k) for r, f in facts(conn).items()}


def run_state(store: Store, run: str, now_ns: int | None = None, k: float = STALL_K) -> RunState | None:
    """The state of one run now; None: no such run."""
    with store.engine.connect() as conn:
        f = facts(conn, run).get(run)
    return None if f is None else decide(f, now_ns if now_ns is not None else time.time_ns(), k)
