"""What an ingest of saved logs asks and records inside its transaction: whether a file was
ingested whole before (by sha256, for logs without timestamps), one ingest_stats row per
source, and the run's incarnation count."""

from __future__ import annotations

import json
import time

import sqlalchemy as sa

from steptail.runs.model import Counters


def ingested_before(conn: sa.Connection, run: str, digest: str) -> bool:
    return conn.execute(
        # older stores kept an untimestamped log's content hash in sha256
        sa.text("SELECT 1 FROM ingest_stats WHERE run = :run AND (content_sha256 = :d OR sha256 = :d) LIMIT 1"),
        {"run": run, "d": digest},
    ).first() is not None


def record_ingest(conn: sa.Connection, run: str, source: str, digest: str | None, started_ns: int,
                  c: Counters, content_digest: str | None = None) -> None:
    """digest: the file's sha256 (as stored); content_digest: an untimestamped log's content's."""
    conn.execute(
        sa.text(
            "INSERT INTO ingest_stats (run, source, sha256, content_sha256, started_ns, finished_ns, lines,"
            " loss_parts, required_rbf, pod_steps, bad_lines, duplicates, bad_samples) VALUES"
            " (:run, :source, :sha, :content, :s, :f, :lines, :lp, :rbf, :ps, :bad, :dup, :samples)"
        ),
        {
            "run": run, "source": source, "sha": digest, "content": content_digest, "s": started_ns, "f": time.time_ns(),
            "lines": c.lines, "lp": c.loss_parts, "rbf": c.required_rbf, "ps": c.pod_steps,
            "bad": c.bad_lines, "dup": c.duplicates, "samples": json.dumps(c.bad_samples),
        },
    )


def incarnation_count(conn: sa.Connection, run: str) -> int:
    return conn.execute(
        sa.text("SELECT COUNT(*) FROM incarnations WHERE run = :run"), {"run": run}
    ).scalar_one()
