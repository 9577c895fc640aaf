"""SQL of `steptail reparse`: a run's rows as comparable records (before and after), the
difference by record kind, clearing a run's line-derived rows for `--replace`, and copying
what was learnt while reading (stream gaps, reconnects, live findings, raw segments) to a
new run. Everything runs in the caller's transaction."""

from __future__ import annotations

import json

import sqlalchemy as sa

from steptail.runs.findings import LIVE_KIND_PATTERN, LIVE_KINDS
from steptail.runs.model import FLAG_KINDS
from steptail.runs.rows import FINDINGS, ROW_TABLES
from steptail.storage import goodput
from steptail.storage.reads import json_value
from steptail.storage.run_inputs import copy_reference

# kind -> (SELECT of key columns, then value columns; number of key columns)
_KINDS: dict[str, tuple[str, int]] = {
    "loss_parts": ("SELECT incarnation, step, ts_ns, ce, ce_raw, parts FROM loss_parts", 2),
    "required_rbf": ("SELECT incarnation, step, ts_ns, max, per_layer, program FROM required_rbf", 2),
    "pod_metrics": ("SELECT incarnation, step, ts_ns, seconds, tflops, tokens_per_s, total_weights, loss, extra"
                    " FROM pod_metrics", 2),
    "config": ("SELECT incarnation, name, value FROM config", 2),
    "checkpoints": ("SELECT incarnation, kind, step, ts_ns FROM checkpoints", 3),
    "incarnations": ("SELECT incarnation, started_ns, saw_start, first_step, last_step, restored_from,"
                     " process_index, process_count, pod FROM incarnations", 1),
    "findings": ("SELECT kind, incarnation, first_step, last_step, detail, severity FROM findings", 3),
    "quarantine": ("SELECT kind, incarnation, step, ts_ns, reason FROM quarantine", 5),
}
# Not compared: cursors (follow's cover every line read, an ingest's the tagged lines only: the
# same rows from the same lines, another high-water mark), ingest_stats (per source).
KINDS = tuple(_KINDS)
# rows rebuilt from the lines (findings: only the flagged ones, see clear_rows)
_CLEARED = (*ROW_TABLES, "loss_summary", "loss_rollup", "goodput_blocks", "goodput_incs", "run_goodput",
            "incarnations", "quarantine", "cursors", "ingest_stats")


def _plain(value):
    """One comparable form whatever the store: JSON columns parsed, booleans as such."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.dumps(json_value(value), sort_keys=True)
        except ValueError:
            return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return value


def snapshot(conn: sa.Connection, run: str) -> dict[str, dict[tuple, tuple]]:
    """Every record of `run` by kind: key -> values."""
    out: dict[str, dict[tuple, tuple]] = {}
    for kind, (sql, nkey) in _KINDS.items():
        records: dict[tuple, tuple] = {}
        for row in conn.execute(sa.text(f"{sql} WHERE run = :run"), {"run": run}):
            row = tuple(_plain(v) for v in row)
            if kind == "incarnations":
                row = row[:2] + (bool(row[2]),) + row[3:]
            records[row[:nkey]] = row[nkey:]
        out[kind] = records
    return out


def diff(before: dict, after: dict, examples: int = 3) -> dict[str, dict]:
    """By kind: rows added, removed, changed, and a few examples of each."""
    report = {}
    for kind in KINDS:
        old, new = before.get(kind, {}), after.get(kind, {})
        added = [k for k in new if k not in old]
        removed = [k for k in old if k not in new]
        changed = [k for k in new if k in old and new[k] != old[k]]
        cols = _columns(kind)
        nkey = _KINDS[kind][1]
        report[kind] = {
            "before": len(old), "after": len(new),
            "added": len(added), "removed": len(removed), "changed": len(changed),
            "examples": (
                [{"change": "added", **_named(cols, k + new[k])} for k in sorted(added, key=repr)[:examples]]
                + [{"change": "removed", **_named(cols, k + old[k])} for k in sorted(removed, key=repr)[:examples]]
                + [{"change": "changed", **_named(cols[:nkey], k),
                    "before": _named(cols[nkey:], old[k]), "after": _named(cols[nkey:], new[k])}
                   for k in sorted(changed, key=repr)[:examples]]),
        }
    return report


def _columns(kind: str) -> list[str]:
    select = _KINDS[kind][0]
    return [c.strip() for c in select[len("SELECT "):select.index(" FROM ")].split(",")]


def _named(cols: list[str], values: tuple) -> dict:
    return dict(zip(cols, values, strict=True))


def clear_rows(conn: sa.Connection, run: str) -> None:
    """`--replace`: the run's rows that its lines made go (rebuilt in the same transaction), and
    the findings flagged while reading them (step and clock jumps); stream gaps, reconnects,
    sources, raw segments, the reference CE and the findings stay: the rebuild's check
    supersedes those it changes or no longer raises (storage/findings.py sync_findings)."""
    for table in _CLEARED:
        conn.execute(sa.text(f"DELETE FROM {table} WHERE run = :run"), {"run": run})
    conn.execute(sa.text("DELETE FROM findings WHERE run = :run AND kind IN :flags")
                 .bindparams(sa.bindparam("flags", expanding=True)), {"run": run, "flags": sorted(FLAG_KINDS)})


_POD_FACTS = ("image", "image_id", "topology", "hosts", "container_started_ns")


def pod_facts(conn: sa.Connection, run: str) -> dict[str, tuple]:
    """What each process-0 pod ran on, as follow recorded it (no log line says it): kept
    across a rebuild by the pod that opened each incarnation."""
    return {r[0]: tuple(r[1:]) for r in conn.execute(sa.text(
        f"SELECT pod, {', '.join(_POD_FACTS)} FROM incarnations WHERE run = :run AND pod IS NOT NULL"
        " AND (image IS NOT NULL OR topology IS NOT NULL OR hosts IS NOT NULL OR container_started_ns IS NOT NULL)"),
        {"run": run})}


def restore_pod_facts(conn: sa.Connection, run: str, facts: dict[str, tuple]) -> None:
    sets = ", ".join(f"{c} = :{c}" for c in _POD_FACTS)
    for pod, values in facts.items():
        conn.execute(sa.text(f"UPDATE incarnations SET {sets} WHERE run = :run AND pod = :pod"),
                     {"run": run, "pod": pod, **dict(zip(_POD_FACTS, values, strict=True))})
    if facts:  # a container's start is an input of the goodput figures (queued_s, wall_s)
        goodput.refresh(conn, run)


def copy_read_facts(conn: sa.Connection, src: str, dst: str) -> None:
    """A new run rebuilt from `src`'s raw log gets what reading it established: its stream
    gaps and reconnects, its live-only findings (stalls, stream and auth failures), its
    raw segments (so `export` of the new run carries them) and its reference CE (its gate is
    evaluated as `src`'s)."""
    p = {"src": src, "dst": dst}
    copy_reference(conn, src, dst)
    conn.execute(sa.text(
        "INSERT INTO stream_gaps (run, stream, start_ns, end_ns, reason, detected_ns)"
        " SELECT :dst, stream, start_ns, end_ns, reason, detected_ns FROM stream_gaps WHERE run = :src"), p)
    conn.execute(sa.text(
        "INSERT INTO stream_reconnects (run, stream, ts_ns, reason)"
        " SELECT :dst, stream, ts_ns, reason FROM stream_reconnects WHERE run = :src"), p)
    conn.execute(sa.text(
        f"INSERT INTO findings ({', '.join(FINDINGS)}) SELECT :dst, {', '.join(FINDINGS[1:])} FROM findings"
        " WHERE run = :src AND (kind IN :live OR kind LIKE :rule)").bindparams(sa.bindparam("live", expanding=True)),
        {**p, "live": sorted(LIVE_KINDS), "rule": LIVE_KIND_PATTERN})
    conn.execute(sa.text(
        "INSERT INTO run_files (run, kind, path, sha256, bytes, lines, first_ns, last_ns, recorded_ns)"
        " SELECT :dst, kind, path, sha256, bytes, lines, first_ns, last_ns, recorded_ns FROM run_files"
        " WHERE run = :src AND kind = 'raw_segment'"), p)


def run_origin(conn: sa.Connection, run: str) -> tuple[str | None, str | None, list[str], set[str]]:
    """(jobset, namespace, sources, streams read to their end) of a run."""
    row = conn.execute(sa.text("SELECT jobset, namespace FROM runs WHERE run = :run"), {"run": run}).first()
    sources = list(conn.execute(sa.text(
        "SELECT source FROM run_sources WHERE run = :run ORDER BY added_ns, source"), {"run": run}).scalars())
    done = {s for s, d in conn.execute(sa.text("SELECT stream, done FROM cursors WHERE run = :run"),
                                       {"run": run}) if d}
    return (row[0] if row else None, row[1] if row else None, sources, done)
