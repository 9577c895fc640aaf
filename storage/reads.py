"""Reads for the CLI, the HTTP API and exports. Values come back as plain Python types."""

from __future__ import annotations

import json
from collections.abc import Iterator

import sqlalchemy as sa

from parsers import format_ns
from storage.db import Store
from storage.sources import sources_of


def json_value(value):
    """A JSON column's value: SQLite hands back the stored text, PostgreSQL (JSONB) objects."""
    return json.loads(value) if isinstance(value, str) else value


def list_runs(store: Store) -> list[dict]:
    sql = sa.text(
        """
        SELECT r.run, r.jobset, r.namespace, r.updated_ns,
          (SELECT COUNT(*) FROM incarnations i WHERE i.run = r.run) AS incarnations,
          (SELECT COUNT(*) FROM loss_parts l WHERE l.run = r.run) AS steps,
          (SELECT MAX(l.step) FROM loss_parts l WHERE l.run = r.run) AS max_step,
          (SELECT COALESCE(SUM(s.bad_lines), 0) FROM ingest_stats s WHERE s.run = r.run) AS bad_lines
        FROM runs r ORDER BY r.run
        """
    )
    with store.engine.connect() as conn:
        rows = conn.execute(sql).mappings().all()
        out = []
        for r in rows:
            last = conn.execute(
                sa.text(
                    "SELECT incarnation, step, ce, ce_raw, ts_ns FROM loss_parts WHERE run = :run"
                    " ORDER BY incarnation DESC, step DESC LIMIT 1"
                ),
                {"run": r["run"]},
            ).first()
            out.append({
                "run": r["run"],
                "jobset": r["jobset"],
                "namespace": r["namespace"],
                "sources": sources_of(conn, r["run"]),
                "incarnations": r["incarnations"],
                "steps": r["steps"],
                "max_step": r["max_step"],
                "last_step": last.step if last else None,
                "last_ce": last.ce if last else None,
                "last_ts": format_ns(last.ts_ns) if last and last.ts_ns is not None else None,
                "bad_lines": int(r["bad_lines"]),
                "updated": format_ns(r["updated_ns"]),
            })
    return out


def run_exists(store: Store, run: str) -> bool:
    with store.engine.connect() as conn:
        return conn.execute(sa.text("SELECT 1 FROM runs WHERE run = :run"), {"run": run}).first() is not None


_STEPS = """
SELECT l.incarnation, l.step, l.ts_ns, l.ce, l.ce_raw, l.parts,
       r.max AS rbf_max, r.per_layer AS rbf_per_layer, r.program AS rbf_program
FROM loss_parts l LEFT JOIN required_rbf r
  ON r.run = l.run AND r.incarnation = l.incarnation AND r.step = l.step
WHERE l.run = :run AND l.step >= :lo AND l.step <= :hi
  AND (l.incarnation > :ai OR (l.incarnation = :ai AND l.step > :as_))
UNION ALL
SELECT r.incarnation, r.step, r.ts_ns, NULL, NULL, NULL, r.max, r.per_layer, r.program
FROM required_rbf r
WHERE r.run = :run AND r.step >= :lo AND r.step <= :hi
  AND (r.incarnation > :ai OR (r.incarnation = :ai AND r.step > :as_)) AND NOT EXISTS (
  SELECT 1 FROM loss_parts l WHERE l.run = r.run AND l.incarnation = r.incarnation AND l.step = r.step)
ORDER BY 1, 2
"""
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
            yield {
                "incarnation": row.incarnation,
                "step": row.step,
                "ts": format_ns(row.ts_ns) if row.ts_ns is not None else None,
                "ce": row.ce,
                "ce_raw": row.ce_raw,
                "parts": json_value(row.parts) if row.parts is not None else {},
                "rbf_max": row.rbf_max,
                "rbf_per_layer": json_value(row.rbf_per_layer) if row.rbf_per_layer is not None else None,
                "rbf_program": row.rbf_program,
            }
