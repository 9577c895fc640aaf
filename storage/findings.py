"""Findings and the SQL store: the offline check (the stored rows fed to the same engine as
`follow`), and idempotent saving (uq_findings: run, kind, incarnation, first_step).

A stored verdict is never silently replaced: a finding that a newer evaluation changes or no
longer raises is first kept as superseded (storage/superseded.py), a finding not evaluated for
want of an input never replaces one evaluated with it (runs/evaluable.py), and the HF reference
CE given once is stored with the run and used when none is given (storage/run_inputs.py)."""

from __future__ import annotations

import logging
from collections import Counter

import sqlalchemy as sa

from steptail.runs.detect import Settings
from steptail.runs.detectors import FindingEngine
from steptail.runs.evaluable import not_evaluable
from steptail.runs.findings import STEP1_CE_GATE, Finding, is_live_kind, sort_key
from steptail.runs.model import FLAG_KINDS, Batch
from steptail.runs.rows import FINDINGS
from steptail.runs.stream_gap import StreamGap
from steptail.storage.db import Store, StoreFailure
from steptail.storage.run_inputs import describe, remember_reference, stored_reference
from steptail.storage.sql import INCARNATION_COLUMNS
from steptail.storage.superseded import change, supersede


def _incarnation_batches(conn: sa.Connection, run: str):
    """One Batch per incarnation, ascending, with the rows the detectors read, in log order."""
    p = {"run": run}
    inc_rows = {
        r[1]: tuple(r) for r in conn.execute(
            sa.text(f"SELECT {', '.join(INCARNATION_COLUMNS)} FROM incarnations WHERE run = :run"), p)
    }
    numbers = set(inc_rows) | {
        r[0] for r in conn.execute(sa.text("SELECT DISTINCT incarnation FROM loss_parts WHERE run = :run"), p)
    }
    for n in sorted(numbers):
        q = {"run": run, "inc": n}
        batch = Batch()
        if n in inc_rows:
            batch.incarnations[n] = inc_rows[n]
        batch.config = [
            (run, n, name, value) for name, value in conn.execute(
                sa.text("SELECT name, value FROM config WHERE run = :run AND incarnation = :inc"), q)
        ]
        batch.checkpoints = [
            (run, n, kind, step, ts) for kind, step, ts in conn.execute(
                sa.text("SELECT kind, step, ts_ns FROM checkpoints WHERE run = :run AND incarnation = :inc"
                        " ORDER BY step, kind"), q)
        ]
        batch.pod_metrics = [  # the step times (step_time_regression)
            (run, n, step, ts, seconds, None, None, None, None, None) for step, ts, seconds in conn.execute(
                sa.text("SELECT step, ts_ns, seconds FROM pod_metrics WHERE run = :run AND incarnation = :inc"
                        " ORDER BY step"), q)
        ]
        batch.loss_parts = [
            (run, n, step, ts, ce, raw, None) for step, ts, ce, raw in conn.execute(
                sa.text("SELECT step, ts_ns, ce, ce_raw FROM loss_parts WHERE run = :run"
                        " AND incarnation = :inc ORDER BY step"), q)
        ]
        batch.required_rbf = [
            (run, n, step, ts, None, None, None) for step, ts in conn.execute(
                sa.text("SELECT step, ts_ns FROM required_rbf WHERE run = :run AND incarnation = :inc"
                        " ORDER BY step"), q)
        ]
        yield batch


def replay(conn: sa.Connection, engine: FindingEngine) -> list[Finding]:
    """Feed a run's stored stream gaps and rows to `engine` (no finish)."""
    run = engine.run
    engine.remember(load_findings(conn, run))  # what the log cannot say again (the JobSet's args)
    out: list[Finding] = []
    for row in conn.execute(
        sa.text("SELECT stream, start_ns, end_ns, reason, detected_ns FROM stream_gaps WHERE run = :run"
                " ORDER BY start_ns"),
        {"run": run},
    ):
        out += engine.observe_stream_gap(StreamGap(*row))
    for batch in _incarnation_batches(conn, run):
        out += engine.observe(batch)
    return out


def check_run(store: Store, run: str, settings: Settings | None = None,
              reference_ce: dict[int, float] | None = None) -> list[Finding]:
    """Offline check of a whole run: every finding its stored rows yield (with the reference
    stored with the run when none is given). Writes nothing."""
    with store.engine.connect() as conn:
        engine = FindingEngine(run, settings, reference_ce or stored_reference(conn, run))
        replay(conn, engine)
    engine.finish()
    return sorted(engine.findings.values(), key=sort_key)


def evaluate_and_store(conn: sa.Connection, run: str, settings: Settings | None = None,
                       reference_ce: dict[int, float] | None = None, by: str = "check") -> list[Finding]:
    """`check` in the caller's transaction: the reference given is stored with the run (or the
    stored one used), every detector runs over the stored rows and the result is synced
    (sync_findings). Returns every finding of the run now stored."""
    reference = remember_reference(conn, run, reference_ce, by)
    engine = FindingEngine(run, settings, reference)
    replay(conn, engine)
    engine.finish()
    return sync_findings(conn, run, list(engine.findings.values()), by=by, context=describe(reference),
                         unevaluated=unevaluated_kinds(reference))


def unevaluated_kinds(reference: dict[int, float] | None) -> frozenset[str]:
    """Kinds an evaluation with this input cannot decide: their stored evaluated findings stay."""
    return frozenset() if reference and 1 in reference else frozenset({STEP1_CE_GATE})


def load_engine(store: Store, run: str, settings: Settings | None = None,
                reference_ce: dict[int, float] | None = None, **kwargs) -> FindingEngine:
    """An engine that has seen everything stored for `run` (for `follow` resuming a run): its
    `findings` hold the history; only what later batches add is returned by observe(). The
    reference given is stored with the run; without one, the stored one is used."""
    with store.engine.begin() as conn:
        reference = remember_reference(conn, run, reference_ce, "follow")
        engine = FindingEngine(run, settings, reference, **kwargs)
        replay(conn, engine)
    return engine


class FindingsFeed:
    """The one adapter between the findings engine and the paths that feed it: ingest's
    (collector/offline/ingest.py) and follow's (collector/live/detect.py `Detectors`, which adds
    the clock, failures, alerts and metrics around it). Every call into the engine is guarded:
    a detector that raises costs findings, never the rows or the run (a store failure is the
    store's: raised). Each error is logged and the first kept (`error`); with `stop_on_error`
    (ingest: its findings are then left as they were) no call follows one. `by` names the
    evaluation on what it stores and supersedes (ingest, reparse)."""

    def __init__(self, run: str, settings: Settings | None = None, reference_ce: dict[int, float] | None = None,
                 *, engine: FindingEngine | None = None, stop_on_error: bool = False, by: str = "ingest") -> None:
        self.run = run
        self.engine = engine if engine is not None else FindingEngine(run, settings, reference_ce)
        self.given = self.reference = reference_ce  # stored with the run at replay
        self.by = by
        self.stop_on_error = stop_on_error
        self.error: str | None = None

    def guard(self, fn, *args):
        """fn(*args), or None when it raised (not a store failure)."""
        if self.stop_on_error and self.error is not None:
            return None
        try:
            return fn(*args)
        except StoreFailure:
            raise  # the store failed, not a detector
        except Exception as exc:  # noqa: BLE001 - a detector bug must not cost the rows
            name = getattr(fn, "__name__", fn)
            self.error = self.error or f"{name}: {exc}"
            _log.warning("%s: detector %s failed: %s", self.run, name, exc)
            return None

    def replay(self, conn: sa.Connection) -> None:
        """What the store holds for the run, seen first (its findings are the engine's history),
        with the reference given stored with the run, or the stored one when none was given."""
        reference = remember_reference(conn, self.run, self.given, self.by)
        self.engine.reference_ce = dict(reference or {})
        self.reference = reference
        self.guard(replay, conn, self.engine)

    def observe(self, batch: Batch, gaps: list[StreamGap] = ()) -> list[Finding]:
        """The findings a committed batch (and the stream gaps committed with it) raise or grow."""
        out = []
        for g in gaps:  # first: gap findings in this batch name the window
            out += self.guard(self.engine.observe_stream_gap, g) or []
        return out + list(self.guard(self.engine.observe, batch) or [])

    def finish(self) -> list[Finding]:
        """The end-of-data checks (the run ended, or the file did)."""
        return self.guard(self.engine.finish) or []

    def sync(self, conn: sa.Connection) -> dict[str, int]:
        """Finish and store what `check` would (the offline path's end); the run's findings by
        kind, after (none when a detector failed: the stored ones are left as they were)."""
        self.finish()
        if self.error is not None:
            return {}
        stored = sync_findings(conn, self.run, list(self.engine.findings.values()), by=self.by,
                               context=describe(self.reference),
                               unevaluated=unevaluated_kinds(self.reference))
        return dict(sorted(Counter(f.kind for f in stored).items()))


_log = logging.getLogger("steptail.findings")


def _upsert_sql(store_or_conn) -> str:
    dialect = store_or_conn.engine.dialect if hasattr(store_or_conn, "engine") else store_or_conn.dialect
    ph = "?" if dialect.paramstyle == "qmark" else "%s"
    return (
        f"INSERT INTO findings ({', '.join(FINDINGS)}) VALUES ({', '.join([ph] * len(FINDINGS))}) "
        "ON CONFLICT (run, kind, incarnation, first_step) DO UPDATE SET "
        "last_step = excluded.last_step, detail = excluded.detail, severity = excluded.severity, "
        # a changed severity is a new verdict: detected now (the old one is kept as superseded)
        "detected_ns = CASE WHEN findings.severity <> excluded.severity THEN excluded.detected_ns"
        " ELSE findings.detected_ns END "
        "WHERE findings.last_step <> excluded.last_step OR findings.detail <> excluded.detail "
        "OR findings.severity <> excluded.severity"
    )


def save_findings(conn: sa.Connection, findings: list[Finding], by: str = "follow", context: str = "") -> int:
    """Insert new findings, bring grown ones up to date; rows written (0 on a re-check). A
    stored finding the new one changes is kept as superseded first (by: the evaluation); one
    evaluated with an input is never replaced by one not evaluable without it."""
    if not findings:
        return 0
    stored = _stored(conn, findings)
    sql = _upsert_sql(conn)
    written = 0
    for f in findings:
        old = stored.get(f.key)
        if old is not None:
            if not_evaluable(f) and not not_evaluable(old):
                continue  # the stored verdict had the input this evaluation lacks: it stays
            why = change(old, f)
            if why is not None:
                supersede(conn, old, by, f"{why} ({by} {context})" if context else why)
        res = conn.exec_driver_sql(sql, (f.run, f.kind, f.incarnation, f.first_step, f.last_step,
                                         f.detail, f.severity, f.detected_ns))
        written += max(res.rowcount, 0)
    return written


def _stored(conn: sa.Connection, findings: list[Finding]) -> dict[tuple, Finding]:
    """The stored findings under the keys of `findings`: a live commit's few by their key (the
    unique index), a whole check's with one read of each run."""
    if len(findings) > _BY_KEY:
        return {f.key: f for run in {f.run for f in findings} for f in load_findings(conn, run)}
    sql = sa.text(f"SELECT {', '.join(FINDINGS)} FROM findings WHERE run = :run AND kind = :kind"
                  " AND incarnation = :inc AND first_step = :first")
    out = {}
    for f in findings:
        row = conn.execute(sql, {"run": f.run, "kind": f.kind, "inc": f.incarnation, "first": f.first_step}).first()
        if row is not None:
            out[f.key] = Finding(**dict(zip(FINDINGS, row, strict=True)))
    return out


_BY_KEY = 16  # up to this many findings are looked up one by one


def load_findings(conn: sa.Connection, run: str) -> list[Finding]:
    rows = conn.execute(
        sa.text(f"SELECT {', '.join(FINDINGS)} FROM findings WHERE run = :run"), {"run": run}
    )
    return sorted((Finding(**dict(zip(FINDINGS, r, strict=True))) for r in rows), key=sort_key)


def stored_findings(store: Store, run: str) -> list[Finding]:
    """The run's stored findings, in check's order."""
    with store.engine.connect() as conn:
        return load_findings(conn, run)


def sync_findings(conn: sa.Connection, run: str, findings: list[Finding], by: str = "check",
                  context: str = "", unevaluated: frozenset[str] = frozenset()) -> list[Finding]:
    """Store the result of an offline check: recomputable findings it no longer yields are
    kept as superseded and dropped (e.g. a gate that now passes with its reference), live-only
    ones (stall, stream and auth failures, runbook rules) and those flagged while reading lines
    (step and clock jumps) are kept, and so are evaluated ones of the `unevaluated` kinds (this
    evaluation lacked their input). Returns every finding of the run now stored."""
    fresh = {f.key for f in findings}
    for f in load_findings(conn, run):
        if f.kind in unevaluated and not not_evaluable(f):
            continue  # evaluated with an input this evaluation lacks: the stored verdict stays
        if not is_live_kind(f.kind) and f.kind not in FLAG_KINDS and f.key not in fresh:
            supersede(conn, f, by, f"no longer raised by {by} {context}".strip())
            conn.execute(
                sa.text("DELETE FROM findings WHERE run = :run AND kind = :kind"
                        " AND incarnation = :inc AND first_step = :first"),
                {"run": run, "kind": f.kind, "inc": f.incarnation, "first": f.first_step},
            )
    save_findings(conn, findings, by, context)
    return load_findings(conn, run)
