"""The reads of the web page (`steptail serve`'s `/`) that the JSON API had no answer for: the
runs table (each run's state, last step and CE, findings by severity) and a run's outline (its
incarnations with their restore points, checkpoints, missing steps and unreadable stretches of
log). The steps themselves come from /api/runs/{run}/steps, the findings from
/api/runs/{run}/findings.

Both cost the number of runs or incarnations, not the steps stored: the last step and the step
counts come from `loss_summary` (kept at each commit, storage.summary), the last CE is one
primary-key lookup per run. The outline's missing steps are reads.missing_steps (the one
definition, steptail.runs.gaps): one pass over the run's step keys, read only when the run
changed (its ETag is the run's state, as /steps)."""

from __future__ import annotations

import sqlalchemy as sa

from steptail.parsers import format_ns
from steptail.runs.state import FOLLOWED_NS, UNKNOWN, RunState
from steptail.storage.reads import missing_steps
from steptail.storage.run_outcome import states
from steptail.storage.sources import sources_of

# /api/overview's live_seconds: a collector's heartbeat this recent means the run is followed
# now (steptail.runs.state); a run's state never comes from when a row was last written
LIVE_NS = FOLLOWED_NS
SEVERITIES = ("critical", "warning")  # counted apiece; any other severity counts as `other`

_RUNS = "SELECT run, jobset, namespace, updated_ns FROM runs ORDER BY run"
_SUMMARY = ("SELECT run, incarnation, steps, lo, hi, first_ts_ns, last_ts_ns FROM loss_summary"
            " ORDER BY run, incarnation")
# The last step of each run (its latest incarnation's highest: what /api/runs calls last_step).
_LAST = """
SELECT l.run, l.ce, l.ce_raw FROM loss_parts l JOIN loss_summary s
  ON l.run = s.run AND l.incarnation = s.incarnation AND l.step = s.hi
WHERE s.incarnation = (SELECT MAX(t.incarnation) FROM loss_summary t WHERE t.run = s.run)
"""
_FINDINGS = "SELECT run, severity, COUNT(*) FROM findings GROUP BY run, severity"
_CURSORS = "SELECT run, MAX(updated_ns) FROM cursors GROUP BY run"
_SOURCES = "SELECT run, source FROM run_sources ORDER BY run, added_ns, source"


def _readable(ns: int | None) -> str | None:
    return None if ns is None else format_ns(ns)


def overview(conn: sa.Connection, now_ns: int) -> list[dict]:
    """One dict per run, by name: where it comes from, its state, incarnations, steps, last
    step, CE and times, and its findings by severity.

    state (steptail.runs.state: live, stalled, ended, failed, ingested, unknown) and
    state_reason, from the run: its source, the end the collector saw, its heartbeat, its
    last step against its step time."""
    summary: dict[str, list[tuple]] = {}
    for run, *rest in conn.execute(sa.text(_SUMMARY)):
        summary.setdefault(run, []).append(tuple(rest))
    last = {run: (ce, raw) for run, ce, raw in conn.execute(sa.text(_LAST))}
    findings: dict[str, dict[str, int]] = {}
    for run, severity, n in conn.execute(sa.text(_FINDINGS)):
        counts = findings.setdefault(run, {})
        key = severity if severity in SEVERITIES else "other"
        counts[key] = counts.get(key, 0) + int(n)
    run_states = states(conn, now_ns)
    cursors = {run: at for run, at in conn.execute(sa.text(_CURSORS))}
    sources: dict[str, list[str]] = {}
    for run, source in conn.execute(sa.text(_SOURCES)):
        sources.setdefault(run, []).append(source)
    out = []
    for run, jobset, namespace, updated_ns in conn.execute(sa.text(_RUNS)):
        incs = summary.get(run, [])
        latest = incs[-1] if incs else None  # (incarnation, steps, lo, hi, first_ts, last_ts)
        ce, ce_raw = last.get(run, (None, None))
        cursor_ns = cursors.get(run)
        last_ts = max((i[5] for i in incs if i[5] is not None), default=None)
        written = max(t for t in (updated_ns, cursor_ns) if t is not None)
        counts = findings.get(run, {})
        run_sources = sources.get(run, [])
        state = run_states.get(run) or RunState(UNKNOWN, "written while it was being read")  # a race
        out.append({
            "run": run, "jobset": jobset, "namespace": namespace, "sources": run_sources,
            "state": state.state, "state_reason": state.reason, "incarnations": len(incs),
            "steps": sum(int(i[1]) for i in incs),
            "last_incarnation": latest[0] if latest else None,
            "last_step": latest[3] if latest else None,
            "last_ce": ce, "last_ce_raw": ce_raw,
            "last_ts": _readable(last_ts), "updated": _readable(written),
            "findings": sum(counts.values()),
            "critical": counts.get("critical", 0), "warning": counts.get("warning", 0),
            "other": counts.get("other", 0),
        })
    return out


_INCARNATIONS = """
SELECT incarnation, started_ns, saw_start, first_step, last_step, restored_from, process_index,
       process_count, pod
FROM incarnations WHERE run = :run ORDER BY incarnation
"""
_RUN_SUMMARY = ("SELECT incarnation, steps, lo, hi, first_ts_ns, last_ts_ns FROM loss_summary"
                " WHERE run = :run ORDER BY incarnation")
_RBF = "SELECT incarnation, COUNT(*) FROM required_rbf WHERE run = :run GROUP BY incarnation"
_CHECKPOINTS = ("SELECT incarnation, kind, step, ts_ns FROM checkpoints WHERE run = :run"
                " ORDER BY incarnation, step, kind")
_STREAM_GAPS = ("SELECT stream, start_ns, end_ns, reason FROM stream_gaps WHERE run = :run"
                " ORDER BY start_ns")


def outline(conn: sa.Connection, run: str) -> dict | None:
    """The run's incarnations (with their LOSS-PARTS counts and step spans, and the restore
    point each resumed from), checkpoints, missing steps and stream gaps; None: no such run."""
    head = conn.execute(sa.text("SELECT jobset, namespace FROM runs WHERE run = :run"), {"run": run}).first()
    if head is None:
        return None
    p = {"run": run}
    incs: dict[int, dict] = {}
    for inc, started, saw_start, first, last, restored, index, count, pod in conn.execute(sa.text(_INCARNATIONS), p):
        incs[inc] = {"incarnation": inc, "started": _readable(started), "saw_start": bool(saw_start),
                     "first_step": first, "last_step": last, "restored_from": restored,
                     "process_index": index, "process_count": count, "pod": pod}
    for inc, steps, lo, hi, t0, t1 in conn.execute(sa.text(_RUN_SUMMARY), p):
        incs.setdefault(inc, {"incarnation": inc}).update(
            {"steps": int(steps), "lo": lo, "hi": hi, "first_ts": _readable(t0), "last_ts": _readable(t1)})
    for inc, n in conn.execute(sa.text(_RBF), p):
        incs.setdefault(inc, {"incarnation": inc})["rbf_steps"] = int(n)
    blank = {"started": None, "saw_start": False, "first_step": None, "last_step": None, "restored_from": None,
             "process_index": None, "process_count": None, "pod": None, "steps": 0, "lo": None, "hi": None,
             "first_ts": None, "last_ts": None, "rbf_steps": 0}
    incarnations = [{"incarnation": n} | blank | incs[n] for n in sorted(incs)]
    checkpoints = [{"incarnation": inc, "kind": kind, "step": step, "ts": _readable(ts)}
                   for inc, kind, step, ts in conn.execute(sa.text(_CHECKPOINTS), p)]
    return {
        "run": run, "jobset": head[0], "namespace": head[1], "sources": sources_of(conn, run),
        "incarnations": incarnations,
        "restores": _restores(incarnations),
        "checkpoints": checkpoints,
        "gaps": missing_steps(conn, run),
        "stream_gaps": [{"stream": s, "start": _readable(a), "end": _readable(b), "reason": why}
                        for s, a, b, why in conn.execute(sa.text(_STREAM_GAPS), p)],
    }


def _restores(incarnations: list[dict]) -> list[dict]:
    """Where incarnations resumed: each that restored a checkpoint (`restored_from`; it starts
    after it), and each later one that did not (a fresh start, or a restore whose line was not
    read) at its first step. `step`: the last step before the resumed ones."""
    out = []
    for i, inc in enumerate(incarnations):
        first = inc["first_step"] if inc["first_step"] is not None else inc["lo"]
        restored = inc["restored_from"]
        if restored is None and (i == 0 or first is None):
            continue
        out.append({"incarnation": inc["incarnation"], "restored_from": restored, "first_step": first,
                    "step": restored if restored is not None else first - 1})
    return out
