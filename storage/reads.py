"""Reads for the CLI, the HTTP API and exports. Values come back as plain Python types."""

from __future__ import annotations

from collections.abc import Iterator

import sqlalchemy as sa

from steptail.parsers import format_ns
from steptail.runs import gaps
from steptail.runs.lineage import survivor_bounds
from steptail.runs.rows import FINDINGS, TABLES
from steptail.runs.state import UNKNOWN, RunState
from steptail.storage import step_columns as sc
from steptail.storage.db import Store
from steptail.storage.run_outcome import states
from steptail.storage.step_columns import json_value


class UnknownRun(LookupError):
    """The store holds no run of that name (the message names the run and the store)."""


def list_runs(store: Store) -> list[dict]:
    """The fields of `runs --json`: run_summaries with readable times."""
    return [{_READABLE.get(k, k): format_ns(v) if k in _READABLE and v is not None else v
             for k, v in r.items()} for r in run_summaries(store)]


_READABLE = {"last_ts_ns": "last_ts", "updated_ns": "updated"}


_SUMMARIES = """
SELECT r.run, r.jobset, r.namespace, r.updated_ns,
  (SELECT COUNT(*) FROM incarnations i WHERE i.run = r.run) AS incarnations,
  (SELECT CAST(COALESCE(SUM(s.steps), 0) AS BIGINT) FROM loss_summary s WHERE s.run = r.run) AS steps,
  (SELECT MAX(s.hi) FROM loss_summary s WHERE s.run = r.run) AS max_step,
  (SELECT COALESCE(SUM(b.bad_lines), 0) FROM ingest_stats b WHERE b.run = r.run) AS bad_lines,
  l.step AS last_step, l.ce AS last_ce, l.ts_ns AS last_ts_ns
FROM runs r
LEFT JOIN loss_summary t ON t.run = r.run
  AND t.incarnation = (SELECT MAX(u.incarnation) FROM loss_summary u WHERE u.run = r.run)
LEFT JOIN loss_parts l ON l.run = t.run AND l.incarnation = t.incarnation AND l.step = t.hi
ORDER BY r.run
"""  # counts and last steps from loss_summary (kept at commit): the cost of a run, not of its steps


def run_summaries(store: Store, now_ns: int | None = None) -> list[dict]:
    """Each run with its state (steptail.runs.state, with the reason), counts and last step
    (its latest incarnation's); times in ns since the epoch (None: unknown)."""
    with store.engine.connect() as conn:
        rows = conn.execute(sa.text(_SUMMARIES)).mappings().all()
        run_states = states(conn, now_ns)
        sources: dict[str, list[str]] = {}
        for run, source in conn.execute(sa.text("SELECT run, source FROM run_sources ORDER BY run, added_ns, source")):
            sources.setdefault(run, []).append(source)
    unknown = RunState(UNKNOWN, "written while it was being read")
    return [{"run": r["run"], "jobset": r["jobset"], "namespace": r["namespace"],
             "sources": sources.get(r["run"], []),
             "state": run_states.get(r["run"], unknown).state, "state_reason": run_states.get(r["run"], unknown).reason,
             "incarnations": r["incarnations"], "steps": int(r["steps"]),
             "max_step": r["max_step"], "last_step": r["last_step"], "last_ce": r["last_ce"],
             "last_ts_ns": r["last_ts_ns"], "bad_lines": int(r["bad_lines"]), "updated_ns": r["updated_ns"]}
            for r in rows]


def run_exists(store: Store, run: str) -> bool:
    with store.engine.connect() as conn:
        return run_exists_on(conn, run)


def run_exists_on(conn: sa.Connection, run: str) -> bool:
    """run_exists on a connection the caller holds."""
    return conn.execute(sa.text("SELECT 1 FROM runs WHERE run = :run"), {"run": run}).first() is not None


def known_run(store: Store, run: str) -> str:
    """`run`, or UnknownRun."""
    if not run_exists(store, run):
        raise UnknownRun(f"no run {run!r} in {store.describe()}")
    return run


def run_location(store: Store, run: str) -> tuple[str | None, str | None]:
    """(jobset, namespace) of a followed run; (None, None) for saved logs or no such run."""
    with store.engine.connect() as conn:
        row = conn.execute(sa.text("SELECT jobset, namespace FROM runs WHERE run = :run"),
                           {"run": run}).first()
    return (row[0], row[1]) if row else (None, None)


_STEPS = f"""
SELECT l.incarnation, l.step, l.ts_ns, {sc.columns(sc.LOSS_COLS, "l")}, {sc.columns(sc.RBF_COLS, "r")}
FROM loss_parts l LEFT JOIN required_rbf r
  ON r.run = l.run AND r.incarnation = l.incarnation AND r.step = l.step
WHERE l.run = :run AND l.step >= :lo AND l.step <= :hi
  AND (l.incarnation > :ai OR (l.incarnation = :ai AND l.step > :as_))
UNION ALL
SELECT r.incarnation, r.step, r.ts_ns, {sc.nulls(sc.LOSS_COLS)}, {sc.columns(sc.RBF_COLS, "r")}
FROM required_rbf r
WHERE r.run = :run AND r.step >= :lo AND r.step <= :hi
  AND (r.incarnation > :ai OR (r.incarnation = :ai AND r.step > :as_)) AND NOT EXISTS (
  SELECT 1 FROM loss_parts l WHERE l.run = r.run AND l.incarnation = r.incarnation AND l.step = r.step)
ORDER BY 1, 2
"""  # the columns from the tables' declarations (storage.step_columns)
_BIG = 2**31 - 1


def iter_steps(store: Store, run: str, lo: int | None = None, hi: int | None = None,
               offset: int = 0, limit: int | None = None,
               after: tuple[int, int] | None = None) -> Iterator[dict]:
    """One dict per (incarnation, step) in log order; the fields of `steps --json`.

    `after=(incarnation, step)` resumes behind a row already read (keyset paging: every
    page costs the same, unlike `offset`)."""
    sql = _STEPS
    ai, as_ = after if after is not None else (-1, -1)
    params = {"run": run, "lo": -1 if lo is None else lo, "hi": _BIG if hi is None else hi,
              "ai": ai, "as_": as_}
    if limit is not None:
        sql += " LIMIT :limit OFFSET :offset"
        params |= {"limit": limit, "offset": offset}
    with store.engine.connect() as conn:
        for row in conn.execute(sa.text(sql), params):
            yield {"incarnation": row[0], "step": row[1], "ts": format_ns(row[2]) if row[2] is not None else None,
                   **sc.own(row[3:], sc.FIELDS)}


def _step_filter(incarnation: int | None, lo: int | None, hi: int | None) -> tuple[str, dict]:
    params = {"lo": -1 if lo is None else lo, "hi": _BIG if hi is None else hi}
    where = " AND step >= :lo AND step <= :hi"
    if incarnation is not None:
        where += " AND incarnation = :inc"
        params["inc"] = incarnation
    return where, params


def iter_loss_parts(store: Store, run: str, incarnation: int | None = None, lo: int | None = None,
                    hi: int | None = None) -> Iterator[tuple]:
    """(incarnation, step, ts_ns, ce, ce_raw, parts) per LOSS-PARTS row, in log order; parts
    as stored (non-finite values are the words "nan", "inf", "-inf")."""
    yield from _rows_of(store, "loss_parts", sc.LOSS_COLS, run, incarnation, lo, hi)


def iter_required_rbf(store: Store, run: str, incarnation: int | None = None, lo: int | None = None,
                      hi: int | None = None) -> Iterator[tuple]:
    """(incarnation, step, ts_ns, max, per_layer, program) per REQUIRED_RBF row, in log order."""
    yield from _rows_of(store, "required_rbf", sc.RBF_COLS, run, incarnation, lo, hi)


def _rows_of(store: Store, table: str, cols: tuple, run: str, incarnation: int | None, lo: int | None,
             hi: int | None) -> Iterator[tuple]:
    """(incarnation, step, ts_ns, *cols) of a step table's rows, in log order, JSON decoded."""
    where, params = _step_filter(incarnation, lo, hi)
    sql = (f"SELECT incarnation, step, ts_ns, {sc.columns(cols)} FROM {table}"
           f" WHERE run = :run{where} ORDER BY incarnation, step")
    decode = tuple(c.type in sc.JSON_TYPES for c in cols)
    with store.engine.connect() as conn:
        for row in conn.execute(sa.text(sql), {"run": run, **params}):
            yield (*row[:3], *(json_value(v) if j and v is not None else v for v, j in zip(row[3:], decode, strict=True)))




def list_findings(store: Store, run: str | None = None) -> list[tuple]:
    """Stored findings (FINDINGS) of one run or of all, in `check`'s order."""
    sql = f"SELECT {', '.join(FINDINGS)} FROM findings"
    params = {}
    if run is not None:
        sql += " WHERE run = :run"
        params["run"] = run
    sql += " ORDER BY run, incarnation, first_step, kind"
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql), params)]


def missing_steps(conn: sa.Connection, run: str) -> list[dict]:
    """The run's missing steps (steptail.runs.gaps) as the export manifest's gaps.steps."""
    heads = conn.execute(sa.text(
        "SELECT incarnation, saw_start, restored_from, first_step FROM incarnations WHERE run = :run"),
        {"run": run}).all()
    steps = conn.execute(
        sa.text("SELECT incarnation, step FROM loss_parts WHERE run = :run ORDER BY incarnation, step"),
        {"run": run}, execution_options={"stream_results": True, "yield_per": 20_000})
    saves = conn.execute(sa.text(
        "SELECT incarnation, step FROM checkpoints WHERE run = :run AND kind = 'save'"), {"run": run}).all()
    periods = [(inc, period) for inc, value in conn.execute(sa.text(
        "SELECT incarnation, value FROM config WHERE run = :run AND name = :name"),
        {"run": run, "name": gaps.PERIOD_PARAM}) if (period := gaps.checkpoint_period(value))]
    return [g.to_dict() for g in gaps.missing_steps(steps, heads, saves, periods)]


def step_gaps(store: Store, run: str) -> list[dict]:
    with store.engine.connect() as conn:
        return missing_steps(conn, run)


def stream_gaps(store: Store, run: str) -> list[tuple]:
    """(stream, start_ns, end_ns, reason) of each stretch of a log that could not be read."""
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(
            "SELECT stream, start_ns, end_ns, reason FROM stream_gaps WHERE run = :run"
            " ORDER BY start_ns"), {"run": run})]


def lineage_bounds(store: Store, run: str) -> dict[int, int | None]:
    """runs.lineage.survivor_bounds of the run's incarnations (the final lineage)."""
    with store.engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT i.incarnation, COALESCE(i.first_step, (SELECT MIN(l.step) FROM loss_parts l"
            " WHERE l.run = i.run AND l.incarnation = i.incarnation)), i.restored_from"
            " FROM incarnations i WHERE i.run = :run"), {"run": run}).all()
    return survivor_bounds(tuple(r) for r in rows)


def table_rows(store: Store, table: str, run: str, columns: tuple[str, ...], order: str) -> list[tuple]:
    """The run's rows of one of the stored tables (runs.rows names its columns), `columns` of
    them, ordered by `order` (column names: never from a user)."""
    known = TABLES[table]
    unknown = [c for c in (*columns, *order.split(", ")) if c not in known]
    if unknown:  # the names are the code's own; a typo must not reach the SQL
        raise ValueError(f"{table} has no column {unknown[0]!r}")
    sql = f"SELECT {', '.join(columns)} FROM {table} WHERE run = :run ORDER BY {order}"
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql), {"run": run})]
