"""Files kept for a run beside the store (`run_files`, migration 0008): raw process-0 log
segments (`follow --raw`) and pod-log archive manifests (`steptail archive`).

    record_file(conn, RunFile(run, RAW_SEGMENT, path, sha256, bytes, lines, first_ns, last_ns))
    run_files(conn, run, kind=None) -> [RunFile, ...]   # oldest first
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import sqlalchemy as sa

RAW_SEGMENT = "raw_segment"
ARCHIVE_MANIFEST = "archive_manifest"
KINDS = (RAW_SEGMENT, ARCHIVE_MANIFEST)


@dataclass(frozen=True)
class RunFile:
    run: str
    kind: str
    path: str  # absolute
    sha256: str | None = None  # None while still being written
    bytes: int = 0
    lines: int | None = None
    first_ns: int | None = None
    last_ns: int | None = None


def record_file(conn: sa.Connection, f: RunFile) -> None:
    """In the caller's transaction; a file recorded before is updated (a segment grows)."""
    if f.kind not in KINDS:
        raise ValueError(f"unknown run file kind {f.kind!r}")
    conn.execute(sa.text(
        "INSERT INTO run_files (run, kind, path, sha256, bytes, lines, first_ns, last_ns, recorded_ns) "
        "VALUES (:run, :kind, :path, :sha256, :bytes, :lines, :first_ns, :last_ns, :now) "
        "ON CONFLICT (run, kind, path) DO UPDATE SET sha256 = excluded.sha256, bytes = excluded.bytes, "
        "lines = excluded.lines, first_ns = excluded.first_ns, last_ns = excluded.last_ns, "
        "recorded_ns = excluded.recorded_ns"),
        {**f.__dict__, "now": time.time_ns()})


def run_files(conn: sa.Connection, run: str, kind: str | None = None) -> list[RunFile]:
    sql = ("SELECT run, kind, path, sha256, bytes, lines, first_ns, last_ns FROM run_files WHERE run = :run"
           + (" AND kind = :kind" if kind else "") + " ORDER BY recorded_ns, path")
    return [RunFile(*r) for r in conn.execute(sa.text(sql), {"run": run, "kind": kind})]
