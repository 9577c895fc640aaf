"""Offline pipeline: saved logs -> parser -> run model -> SQL and Parquet sinks.

One ingest is one transaction: it lands whole or not at all (Parquet files are renamed into
place only after the SQL commit)."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import sqlalchemy as sa

from collector.files import Source, first_timestamp, read_pieces
from parsers import candidate_lines
from steptail.model import Counters
from storage.db import Store
from storage.parquet import ParquetSink
from storage.sql import SqlSink, load_model

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
FLUSH_ROWS = 50_000


class IngestError(Exception):
    pass


def check_run_name(run: str) -> str:
    if not RUN_NAME.match(run):
        raise IngestError(
            f"run name {run!r} is not a safe identifier (letters, digits, '.', '_', '-'; "
            "at most 128; starting with a letter or digit)"
        )
    return run


@dataclass
class IngestResult:
    run: str
    lines: int = 0
    loss_parts: int = 0
    required_rbf: int = 0
    pod_steps: int = 0
    bad_lines: int = 0
    incarnations: int = 0
    duplicates: int = 0
    bad_samples: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # sources already ingested whole

    def summary(self) -> dict:
        keys = ("run", "lines", "loss_parts", "required_rbf", "pod_steps", "bad_lines", "incarnations")
        return {k: getattr(self, k) for k in keys}

    def full(self) -> dict:
        return asdict(self)


def order_sources(sources: list[Source]) -> list[Source]:
    """Timestamped logs in time order (an old pod's log before its replacement's)."""
    firsts = [first_timestamp(s) for s in sources]
    if all(f is not None for f in firsts):
        return [s for _, s in sorted(zip(firsts, sources, strict=True), key=lambda p: p[0])]
    return sources


def _sha256(source: Source) -> str:
    h = hashlib.sha256()
    while chunk := source.stream.read(1 << 22):
        h.update(chunk)
    source.stream.seek(0)
    return h.hexdigest()


def ingest(
    store: Store,
    run: str,
    sources: list[Source],
    parquet: str | Path | None = None,
    progress: Callable[[int], None] | None = None,
) -> IngestResult:
    check_run_name(run)
    sink = SqlSink(store)
    pq_sink = ParquetSink(parquet, run) if parquet else None
    result = IngestResult(run)
    try:
        with store.engine.begin() as conn:
            sink.ensure_run(conn, run)
            model = load_model(conn, run)
            done = 0
            for source in order_sources(sources):
                tick = (lambda pos, base=done: progress(base + pos)) if progress else None
                started = time.time_ns()
                model.counters = Counters()
                digest = None
                if first_timestamp(source) is None:
                    # Untimestamped lines have no identity of their own: dedupe whole files.
                    digest = _sha256(source)
                    if _seen(conn, run, digest):
                        result.skipped.append(source.name)
                        continue
                _feed(model, source, sink, pq_sink, conn, tick)
                done += source.size or 0
                _flush(model, sink, pq_sink, conn)
                _record(conn, run, source.name, digest, started, model.counters)
                _add(result, model.counters)
            result.incarnations = conn.execute(
                sa.text("SELECT COUNT(*) FROM incarnations WHERE run = :run"), {"run": run}
            ).scalar_one()
    except BaseException:
        if pq_sink:
            pq_sink.abort()
        raise
    if pq_sink:
        pq_sink.commit()
    return result


def _feed(model, source, sink, pq_sink, conn, progress) -> None:
    feed = model.feed
    for piece in read_pieces(source):
        model.counters.lines += piece.lines
        if piece.bad:
            model.bad_line(piece.bad)
        for line in candidate_lines(piece.block):
            feed(line)
        if len(model.batch) >= FLUSH_ROWS:
            _flush(model, sink, pq_sink, conn)
        if progress:
            progress(source.position())


def _flush(model, sink, pq_sink, conn) -> None:
    batch = model.take()
    sink.write(conn, model.run, batch)
    if pq_sink:
        pq_sink.write(batch)


def _seen(conn, run: str, digest: str) -> bool:
    return conn.execute(
        sa.text("SELECT 1 FROM ingest_stats WHERE run = :run AND sha256 = :d LIMIT 1"),
        {"run": run, "d": digest},
    ).first() is not None


def _record(conn, run, name, digest, started, c) -> None:
    conn.execute(
        sa.text(
            "INSERT INTO ingest_stats (run, source, sha256, started_ns, finished_ns, lines,"
            " loss_parts, required_rbf, pod_steps, bad_lines, duplicates, bad_samples) VALUES"
            " (:run, :source, :sha, :s, :f, :lines, :lp, :rbf, :ps, :bad, :dup, :samples)"
        ),
        {
            "run": run, "source": name, "sha": digest, "s": started, "f": time.time_ns(),
            "lines": c.lines, "lp": c.loss_parts, "rbf": c.required_rbf, "ps": c.pod_steps,
            "bad": c.bad_lines, "dup": c.duplicates, "samples": json.dumps(c.bad_samples),
        },
    )


def _add(result: IngestResult, c) -> None:
    result.lines += c.lines
    result.loss_parts += c.loss_parts
    result.required_rbf += c.required_rbf
    result.pod_steps += c.pod_steps
    result.bad_lines += c.bad_lines
    result.duplicates += c.duplicates
    result.bad_samples.extend(c.bad_samples[: 5 - len(result.bad_samples)])
