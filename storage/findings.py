"""Findings and the SQL store: the offline check (the stored rows fed to the same engine as
`follow`), and idempotent saving (uq_findings: run, kind, incarnation, first_step)."""

from __future__ import annotations

import logging
from collections import Counter

import sqlalchemy as sa

from steptail.runs.detectors import FindingEngine
from steptail.runs.findings import Finding, Settings, is_live_kind, sort_key
from steptail.runs.model import FLAG_KINDS, Batch
from steptail.runs.rows import FINDINGS
from steptail.runs.stream_gap import StreamGap
from steptail.storage.db import Store, StoreFailure
from steptail.storage.sql import INCARNATION_COLUMNS


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
    """Offline check of a whole run: every finding its stored rows yield."""
    engine = FindingEngine(run, settings, reference_ce)
    with store.engine.connect() as conn:
        replay(conn, engine)
    engine.finish()
    return sorted(engine.findings.values(), key=sort_key)


def load_engine(store: Store, run: str, settings: Settings | None = None,
                reference_ce: dict[int, float] | None = None, **kwargs) -> FindingEngine:
    """An engine that has seen everything stored for `run` (for `follow` resuming a run): its
    `findings` hold the history; only what later batches add is returned by observe()."""
    engine = FindingEngine(run, settings, reference_ce, **kwargs)
    with store.engine.connect() as conn:
        replay(conn, engine)
    return engine


class FindingsFeed:
    """The one adapter between the findings engine and the paths that feed it: ingest's
    (collector/offline/ingest.py) and follow's (collector/live/detect.py `Detectors`, which adds
    the clock, failures, alerts and metrics around it). Every call into the engine is guarded:
    a detector that raises costs findings, never the rows or the run (a store failure is the
    store's: raised). Each error is logged and the first kept (`error`); with `stop_on_error`
    (ingest: its findings are then left as they were) no call follows one."""

    def __init__(self, run: str, settings: Settings | None = None, reference_ce: dict[int, float] | None = None,
                 *, engine: FindingEngine | None = None, stop_on_error: bool = False) -> None:
        self.run = run
        self.engine = engine if engine is not None else FindingEngine(run, settings, reference_ce)
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
        """What the store holds for the run, seen first (its findings are the engine's history)."""
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
        stored = sync_findings(conn, self.run, list(self.engine.findings.values()))
        return dict(sorted(Counter(f.kind for f in stored).items()))


_log = logging.getLogger("steptail.findings")


def _upsert_sql(store_or_conn) -> str:
    dialect = store_or_conn.engine.dialect if hasattr(store_or_conn, "engine") else store_or_conn.dialect
    ph = "?" if dialect.paramstyle == "qmark" else "%s"
    return (
        f"INSERT INTO findings ({', '.join(FINDINGS)}) VALUES ({', '.join([ph] * len(FINDINGS))}) "
        "ON CONFLICT (run, kind, incarnation, first_step) DO UPDATE SET "
        "last_step = excluded.last_step, detail = excluded.detail, severity = excluded.severity "
        "WHERE findings.last_step <> excluded.last_step OR findings.detail <> excluded.detail "
        "OR findings.severity <> excluded.severity"
    )


def save_findings(conn: sa.Connection, findings: list[Finding]) -> int:
    """Insert new findings, bring grown ones up to date; rows written (0 on a re-check)."""
    sql = _upsert_sql(conn)
    written = 0
    for f in findings:
        res = conn.exec_driver_sql(sql, (f.run, f.kind, f.incarnation, f.first_step, f.last_step,
                                         f.detail, f.severity, f.detected_ns))
        written += max(res.rowcount, 0)
    return written


def load_findings(conn: sa.Connection, run: str) -> list[Finding]:
    rows = conn.execute(
        sa.text(f"SELECT {', '.join(FINDINGS)} FROM findings WHERE run = :run"), {"run": run}
    )
    return sorted((Finding(**dict(zip(FINDINGS, r, strict=True))) for r in rows), key=sort_key)


def stored_findings(store: Store, run: str) -> list[Finding]:
    """The run's stored findings, in check's order."""
    with store.engine.connect() as conn:
        return load_findings(conn, run)


def sync_findings(conn: sa.Connection, run: str, findings: list[Finding]) -> list[Finding]:
    """Store the result of an offline check: recomputable findings it no longer yields are
    dropped (e.g. a gate that now has its reference), live-only ones (stall, stream and auth
    failures, runbook rules) and those flagged while reading lines (step and clock jumps) are kept. Returns
    every finding of the run now stored."""
    fresh = {f.key for f in findings}
    for f in load_findings(conn, run):
        if not is_live_kind(f.kind) and f.kind not in FLAG_KINDS and f.key not in fresh:
            conn.execute(
                sa.text("DELETE FROM findings WHERE run = :run AND kind = :kind"
                        " AND incarnation = :inc AND first_step = :first"),
                {"run": run, "kind": f.kind, "inc": f.incarnation, "first": f.first_step},
            )
    save_findings(conn, findings)
    return load_findings(conn, run)
