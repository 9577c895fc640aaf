"""Offline pipeline: saved logs -> parser -> run model -> SQL and Parquet sinks, and the
findings engine (the one `check` and `follow` use), fed each batch as it is written.

One ingest is one transaction: it lands whole or not at all, findings included (Parquet files
are completed before the SQL commit and renamed into place only after it; a failure removes
them). A source with no record line is refused: nothing of it is written.

`parquet` a table location (s3://, gs://, file://: the lake, storage.lake): after the SQL
commit, what SQL holds for the run and the tables lack is appended from SQL (catch_up_lake,
exactly once). A lake failure costs no row (SQL has them all; the next ingest or `steptail lake
catch-up` fills the tables): the result says why, the command warns."""

from __future__ import annotations

import gc
import hashlib
import logging
import multiprocessing as mp
import os
import sys
import time
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from steptail.collector.offline.files import (
    BLOCK,
    Piece,
    Source,
    first_timestamp,
    line_ranges,
    open_source,
    parse_range,
    read_pieces,
    read_range,
    worker_init,
)
from steptail.parsers.block import line_by_line, parse_block
from steptail.parsers.records import BlockKind
from steptail.runs.detect import Settings
from steptail.runs.model import Batch, Counters, RunModel
from steptail.runs.names import check_run_name
from steptail.storage.db import DatabaseFailure, Store, failure_reason, open_store
from steptail.storage.durable import file_sha256
from steptail.storage.findings import FindingsFeed
from steptail.storage.ingests import incarnation_count, ingested_before, record_ingest
from steptail.storage.parquet_error import ParquetError
from steptail.storage.sources import FILES
from steptail.storage.sql import SqlSink, load_model

if TYPE_CHECKING:
    from steptail.storage.parquet import ParquetSink

FLUSH_ROWS = 20_000
WINDOW = 4  # blocks in flight to the workers: bounds memory
POOL_MIN_BYTES = 32 << 20  # below this, starting workers costs more than it saves
READ_BLOCK = BLOCK
SWITCH_INTERVAL = 0.0005  # s: the GIL's, while the writer threads run (see Ingest.__call__)


class IngestError(Exception):
    """The ingest failed; the message is one line, safe to show."""


class NoRecords(IngestError):
    """No source held a record line: nothing was written (not even the run)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        super().__init__(f"no record line in {', '.join(names)}: nothing written")


@dataclass
class IngestResult(Counters):
    run: str = ""
    incarnations: int = 0  # of the run, after this ingest
    skipped: list[str] = field(default_factory=list)  # sources already ingested whole
    no_records: list[str] = field(default_factory=list)  # sources refused: not one record line
    findings: dict[str, int] = field(default_factory=dict)  # the run's stored findings by kind, after
    findings_error: str | None = None  # a detector failed: findings left as they were
    sha256: dict[str, str | None] = field(default_factory=dict)  # source -> its file's sha256
    lake_rows: int | None = None  # --parquet URL: rows the lake's tables gained from SQL
    lake_error: str | None = None  # --parquet URL: why the tables were not brought up to date
    parquet_rows: int | None = None  # --parquet DIR: rows stored before, back-filled from SQL
    parquet_error: str | None = None  # --parquet DIR: why the back-fill failed (SQL has the rows)

    def summary(self) -> dict:
        keys = ("run", "lines", "loss_parts", "required_rbf", "pod_steps", "bad_lines", "flagged", "incarnations")
        return {k: getattr(self, k) for k in keys}


@dataclass(frozen=True)
class Origin:
    """Where the sources come from. Default: saved files (source `files`, one stream "log"
    deduplicated across files). A JobSet's archived pod logs (`steptail archive`) are the
    JobSet's own: its kubernetes source, and each file the stream key `follow` gives that
    container (`uid/container/restart`), so the cursor follow left drops what it read."""

    source: str = FILES
    jobset: str | None = None
    namespace: str | None = None
    streams: dict[str, str] = field(default_factory=dict)  # source name -> stream key
    finished: frozenset[str] = frozenset()  # stream keys whose container had terminated


def order_sources(sources: list[Source]) -> list[Source]:
    """Timestamped logs in time order (an old pod's log before its replacement's)."""
    firsts = [first_timestamp(s) for s in sources]
    if all(f is not None for f in firsts):
        return [s for _, s in sorted(zip(firsts, sources, strict=True), key=lambda p: p[0])]
    return sources


def _read_by_workers(source: Source) -> bool:
    """Whether workers may read this source's ranges themselves (collector.offline.files.line_ranges)."""
    return source.stream is source.raw and source.name != "<stdin>" and source.size is not None


def _file_sha256(path: str) -> str | None:
    """sha256 of a file read again (when it could not be hashed as it was read)."""
    return None if path == "<stdin>" else file_sha256(path)


def _sha256(source: Source) -> str:
    """sha256 of the source's content (a .gz: decompressed), read from its start; rewound."""
    digest = hashlib.file_digest(source.stream, "sha256").hexdigest()
    source.stream.seek(0)
    return digest


def ingest(store: Store, run: str, sources: list[Source], parquet: str | Path | None = None,
           progress: Callable[[int], None] | None = None, pool: Workers | None = None, append: bool = False,
           settings: Settings | None = None, reference_ce: dict[int, float] | None = None,
           origin: Origin | None = None) -> IngestResult:
    """Ingest `sources` into `run` (Ingest with these options)."""
    return Ingest(store, run, parquet=parquet, progress=progress, pool=pool, append=append, settings=settings,
                  reference_ce=reference_ce, origin=origin or Origin())(sources)


@dataclass
class Ingest:
    """One ingest: `sources` into `run`, one transaction. `pool`: workers from start_workers(),
    started before the store was opened so that they boot while the schema is checked (else
    started here). A run that holds data of another source (a followed JobSet) raises
    SourceConflict and nothing is written, unless `append` says it is the same run. The run's
    findings are stored as `check` with these `settings` and `reference_ce` would store them.
    Sources without a record line are left out (`no_records`); if none has one, NoRecords.

    `reparse` composes it (a subclass whose `prepare` and `before_commit` add to the
    transaction), `archive` through ingest_paths (an Origin naming each file's stream)."""

    store: Store
    run: str
    parquet: str | Path | None = None
    progress: Callable[[int], None] | None = None  # bytes read of all sources
    pool: Workers | None = None
    append: bool = False
    settings: Settings | None = None
    reference_ce: dict[int, float] | None = None
    origin: Origin = field(default_factory=Origin)
    evaluation = "ingest"  # names it on the findings it supersedes and the reference it stores

    def prepare(self, conn) -> None:
        """First in the transaction, before the run's row and model are read."""

    def before_commit(self, conn) -> None:
        """Last in the transaction, after the findings were stored."""

    def __call__(self, sources: list[Source]) -> IngestResult:
        """The sources read into the run, committed whole or not at all."""
        check_run_name(self.run)
        sink = SqlSink(self.store)
        lake = _lake_url(self.parquet)
        pq_sink = _parquet_sink(self.parquet, self.run) if self.parquet and lake is None else None
        result = IngestResult(run=self.run)
        detectors = FindingsFeed(self.run, self.settings, self.reference_ce, stop_on_error=True,
                                 by=self.evaluation)
        pool = self.pool if self.pool is not None else start_workers(sources)
        hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="steptail-sha256")
        # The rows in flight are acyclic; the cyclic collector would only rescan them (~20%).
        gc_was_enabled = gc.isenabled()
        gc.disable()
        # The writers give the GIL up for each SQLite step and Arrow kernel and then wait for
        # it; while another thread runs Python that wait is the switch interval (5 ms), paid
        # thousands of times per ingest. A shorter one keeps them fed.
        switch_was = sys.getswitchinterval()
        sys.setswitchinterval(min(switch_was, SWITCH_INTERVAL))
        try:
            # The writer threads stop before the transaction ends, committed or rolled back: none
            # may write to the connection or to a Parquet file after that.
            with self.store.engine.begin() as conn, \
                    _Writer(sink, pq_sink, conn, self.run, detectors.observe) as writer:
                self.prepare(conn)
                origin = self.origin
                sink.ensure_run(conn, self.run, origin.jobset, origin.namespace, source=origin.source,
                                append=self.append)
                model = load_model(conn, self.run)
                detectors.replay(conn)
                done = 0
                for source in order_sources(sources):
                    tick = (lambda pos, base=done: self.progress(base + pos)) if self.progress else None
                    if self._source(conn, sink, model, writer, source, tick, pool, hasher, result):
                        done += source.size or 0
                if len(result.no_records) == len(sources):
                    raise NoRecords(result.no_records)  # rolls back the run row ensure_run made
                result.incarnations = incarnation_count(conn, self.run)
                result.findings = detectors.sync(conn)
                result.findings_error = detectors.error
                self.before_commit(conn)
                if pq_sink:
                    pq_sink.finish()  # a full disk fails here, before the SQL commit
        except BaseException:
            if pq_sink:
                pq_sink.abort()
            raise
        finally:
            if gc_was_enabled:
                gc.enable()
            sys.setswitchinterval(switch_was)
            if self.pool is None and pool is not None:
                pool.shutdown()
            hasher.shutdown(cancel_futures=True)
        if pq_sink:
            pq_sink.commit()
            result.parquet_rows, result.parquet_error = _back_fill(self.store, self.run, self.parquet)
        elif lake is not None:
            result.lake_rows, result.lake_error = _write_lake(self.store, self.run, lake)
        return result

    def _source(self, conn, sink: SqlSink, model: RunModel, writer: _Writer, source: Source, tick, pool,
                hasher, result: IngestResult) -> bool:
        """One source read into the model and written, its ingest recorded (or left out: not
        one record line); False when it was skipped unread (ingested whole before)."""
        started = time.time_ns()
        model.counters = Counters()
        stream = self.origin.streams.get(source.name, "log")
        model.new_read(stream)  # a clock jump is measured within one file
        digest = content = None
        if first_timestamp(source) is None:
            # Untimestamped lines have no identity of their own: dedupe whole files.
            # (its content's: the same log plain or gzipped is one log)
            content = _sha256(source)
            digest = source.sha256()  # the file's own (a .gz: as stored)
            if ingested_before(conn, self.run, content):
                result.skipped.append(source.name)
                return False
        cursors_before = {k: c.copy() for k, c in model.cursors.items()}
        submitted = writer.submitted
        # workers read a big plain file's ranges themselves: hash it meanwhile, in a thread
        hashing = hasher.submit(_file_sha256, source.name) if pool is not None and \
            source.sha256() is None and _read_by_workers(source) else None
        if source.pod is not None:
            model.pod = source.pod
        _feed(model, source, writer, tick, pool, stream)
        model.settle()  # the file ended: a step still held back has no step after it
        if stream in self.origin.finished:
            model.finish_stream(stream)
        if writer.submitted == submitted and not _holds_records(model):
            result.no_records.append(source.name)
            model.take()  # what it left holds no row: its cursor move and bad-line count
            model.cursors = cursors_before
            return True
        _flush(model, writer)
        writer.drain()
        for table, _, why in sink.take_refused():
            model.counters.bad(f"store refused a {table} row (quarantined): {why}")
        digest = digest or source.sha256() or (hashing.result() if hashing else None) \
            or _file_sha256(source.name)
        result.sha256[source.label or source.name] = digest
        record_ingest(conn, self.run, source.label or source.name, digest, started, model.counters, content)
        result.add(model.counters)
        return True


def ingest_paths(db: str | None, run: str, paths: Sequence[str], *, parquet: str | Path | None = None,
                 append: bool = False, settings: Settings | None = None,
                 reference_ce: dict[int, float] | None = None,
                 progress: Callable[[int, int], None] | None = None, origin: Origin | None = None) -> IngestResult:
    """`steptail ingest`: the logs at `paths` (plain, --timestamps, .gz; '-' is stdin, once) into
    `run` of the store at `db`, as ingest() does. Parse workers boot while the store is opened
    and migrated; all is released on return. `progress(bytes_read, total_bytes)`.

    Every failure is one line: RunNameError, SourceError (a path), StoreError (the store),
    SourceConflict (the run is another source's), NoRecords, IngestError (nothing written)."""
    check_run_name(run)
    if list(paths).count("-") > 1:
        raise IngestError("'-' (stdin) may be given once")
    if isinstance(parquet, str) and "://" in parquet:  # a table location: checked before anything is read
        from steptail.storage.object_store import io_properties, parse_location

        try:
            io_properties(parse_location(parquet), os.environ)
        except ValueError as exc:
            raise IngestError(f"--parquet {parquet}: {exc}") from None
    sources: list[Source] = []
    try:
        for path in paths:
            sources.append(open_source(path))
        pool = start_workers(sources)
        try:
            store = open_store(db)
            try:
                total = sum(s.size or 0 for s in sources)
                tick = (lambda pos: progress(pos, total)) if progress else None
                return ingest(store, run, sources, parquet=parquet, progress=tick, pool=pool,
                              append=append, settings=settings, reference_ce=reference_ce, origin=origin)
            except ParquetError as exc:  # before OSError: it is one
                raise IngestError(f"{exc}; nothing written (SQL rolled back)") from exc
            except (OSError, EOFError, zlib.error) as exc:
                raise IngestError(f"read failed, nothing written: {exc}") from exc
            except DatabaseFailure as exc:  # a full disk, a lost connection
                raise IngestError(f"cannot write to database {store.describe()}: {failure_reason(exc)};"
                                  " nothing written") from exc
            finally:
                store.dispose()
        finally:
            if pool is not None:
                pool.shutdown()
    finally:
        for s in sources:
            s.close()


def _parquet_sink(parquet: str | Path, run: str) -> ParquetSink:
    from steptail.storage.parquet import ParquetSink  # pyarrow: only when Parquet is written

    return ParquetSink(parquet, run)


def _back_fill(store: Store, run: str, parquet: str | Path) -> tuple[int | None, str | None]:
    """After the commit: what SQL held for the run before this ingest (or another path added)
    and the dataset lacks, written from SQL, and the run's findings, stream gaps and
    reconnects (storage.catchup.catch_up: by key, so a rerun writes nothing). Returns (rows
    written, None), or (None, why): SQL holds the rows, so that only warns."""
    from steptail.storage.catchup import catch_up

    try:
        return catch_up(store, run, parquet), None
    except Exception as exc:  # noqa: BLE001 - after the commit, SQL has the rows: reported, not raised
        text = str(exc).strip()
        return None, text.splitlines()[0][:300] if text else type(exc).__name__


def _lake_url(parquet: str | Path | None) -> str | None:
    """`parquet` when it names a table location (a URL), else None (a local dataset folder)."""
    if not isinstance(parquet, str) or "://" not in parquet:
        return None
    from steptail.storage.lake import is_lake  # pyiceberg: only when a lake is used

    return parquet if is_lake(parquet) else None


def check_lake(lake) -> None:
    """Raise LakeError unless the tables the catalog holds are at the lake's location. The
    catalog (in the store's database) knows one table per name: were they made at another
    location, a Lake for this one would write there."""
    from steptail.storage.lake import LakeError

    for where in _table_locations(lake):
        if not where.startswith(lake.location.uri.rstrip("/") + "/"):
            root = where.split("/metadata/", 1)[0].rsplit("/", 2)[0]
            raise LakeError(f"this store's lake is at {root}, not {lake.location.uri}: "
                            "its catalog holds one table of each name (one store, one lake)")


def _table_locations(lake) -> list[str]:
    """Where the catalog's tables keep their metadata: from the catalog's own SQL table (no
    object read: a check at start costs no request to the bucket), else from the tables."""
    from steptail.storage.lake import NAMESPACE, TABLES, LakeError

    catalog = lake.catalog  # opened here: one no command can use raises LakeError
    try:
        import sqlalchemy as sa
        from pyiceberg.catalog.sql import IcebergTables

        query = sa.select(IcebergTables.metadata_location).where(
            IcebergTables.catalog_name == catalog.name, IcebergTables.table_namespace == NAMESPACE)
        with catalog.engine.connect() as conn:
            return [r[0] for r in conn.execute(query) if r[0]]
    except (ImportError, AttributeError):  # another pyiceberg: ask the tables themselves
        return [tbl.location() + "/metadata/" for name in TABLES if (tbl := lake.table(name, create=False)) is not None]
    except Exception as exc:  # noqa: BLE001 - the catalog's database failed
        raise LakeError(f"cannot read the lake's catalog: {str(exc).strip().splitlines()[0]}") from exc


def _write_lake(store: Store, run: str, url: str) -> tuple[int | None, str | None]:
    """After the commit: the lake's tables brought up to date with the run as SQL holds it
    (read back from SQL: exactly once, whatever an earlier ingest left undone). Returns (rows
    added, None), or (None, why) when it failed: SQL holds the rows, so that only warns."""
    from steptail.storage.catchup import catch_up_lake
    from steptail.storage.lake import Lake

    try:
        lake = Lake(url, store.catalog_url())
        check_lake(lake)
        return catch_up_lake(store, run, lake), None
    except Exception as exc:  # noqa: BLE001 - whatever it was, SQL has the rows: reported, not raised
        text = str(exc).strip()
        reason = text.splitlines()[0][:300] if text else type(exc).__name__
        logging.getLogger("steptail.ingest").debug("lake write of %s failed", run, exc_info=True)
        return None, reason


def _holds_records(model: RunModel) -> bool:
    """Whether the source just read (none of its rows flushed yet) yielded a record or
    repeated one already read: a line of it made a row, a flag, an incarnation or a duplicate."""
    c, batch = model.counters, model.batch
    return bool(c.loss_parts or c.required_rbf or c.pod_steps or c.flagged or c.duplicates
                or len(batch) or batch.incarnations or batch.flags)


def _feed(model, source, writer, progress, pool, stream: str = "log") -> None:
    """Blocks are parsed in worker processes (pure, ordered) and applied here in order."""
    window: deque = deque()

    def apply(parsed, piece, pos: int | None = None, reread=None) -> None:
        model.counters.lines += piece.lines
        if piece.bad:
            model.bad_line(piece.bad)
        apply_parsed(model, parsed, reread or (lambda a, b: piece.block[a:b]), stream=stream)
        if len(model.batch) >= FLUSH_ROWS:
            _flush(model, writer)
        if progress:
            progress(source.position() if pos is None else pos)

    def apply_range(result, start: int, end: int) -> None:
        lines, bad, parsed = result
        # the block stayed in the worker: read what is needed again here
        apply(parsed, Piece(b"", lines, bad), end,
              lambda a, b: read_range(source.name, start + a, end if b is None else start + b).block)

    ranges = line_ranges(source, READ_BLOCK) if pool is not None else None
    try:
        if ranges is not None:  # workers read their own ranges of the file
            window = pool.take_ahead(source)  # the first ones may be under way already
            for start, end in ranges[len(window):]:
                window.append((pool.submit(parse_range, source.name, start, end), (start, end)))
                if len(window) >= WINDOW:
                    future, (a, b) = window.popleft()
                    apply_range(future.result(), a, b)
            while window:
                future, (a, b) = window.popleft()
                apply_range(future.result(), a, b)
            return
        for piece in read_pieces(source, READ_BLOCK):
            if pool is None:
                apply(parse_block(piece.block), piece)
                continue
            window.append((pool.submit(parse_block, piece.block), piece))
            if len(window) >= WINDOW:
                future, done = window.popleft()
                apply(future.result(), done)
        while window:
            future, done = window.popleft()
            apply(future.result(), done)
    finally:
        for future, _ in window:
            future.cancel()


def apply_parsed(model, parsed: tuple, reread, start: int = 0, end: int | None = None, stream: str = "log") -> None:
    """Feed one parse_block result to the model, in line order. A steady part the model cannot
    take whole (its state needs each line) is read again (`reread(start, end)`, offsets in
    the block, end None for its end) and fed line by line."""
    kind, body = parsed
    if kind == BlockKind.SPLIT:
        for a, b, part in body:
            apply_parsed(model, part, reread, start + a, start + b, stream)
    elif kind == BlockKind.LINES:
        model.feed_items(body, stream)
    elif not model.feed_steady(body, stream):
        model.feed_items(line_by_line(reread(start, end)), stream)


class Workers:
    """Parse worker processes (forkserver: children never inherit DB connections), with the
    first ranges of the first plain-file source already submitted: they parse while the
    caller opens and migrates the store."""

    def __init__(self, pool: ProcessPoolExecutor, sources: list[Source]) -> None:
        self.pool = pool
        self._ahead: dict[int, deque] = {}
        first = order_sources(sources)[0]
        ranges = line_ranges(first, READ_BLOCK)
        if ranges:
            self._ahead[id(first)] = deque(
                (pool.submit(parse_range, first.name, a, b), (a, b)) for a, b in ranges[:WINDOW])

    def submit(self, fn, *args):
        return self.pool.submit(fn, *args)

    def take_ahead(self, source: Source) -> deque:
        """The futures already submitted for `source`'s first ranges (empty if none)."""
        return self._ahead.pop(id(source), deque())

    def shutdown(self) -> None:
        for window in self._ahead.values():
            for future, _ in window:
                future.cancel()
        self.pool.shutdown(cancel_futures=True)


def start_workers(sources: list[Source]) -> Workers | None:
    """Workers for big inputs, already booting and parsing when this returns. As many as
    cores: the main thread and the writers mostly wait on them or on SQLite. None for small
    inputs or one core."""
    cpus = os.cpu_count() or 1
    workers = int(os.environ.get("STEPTAIL_INGEST_WORKERS", min(cpus, 4)))
    if workers < 1 or cpus < 2 or sum(s.size or 0 for s in sources) < POOL_MIN_BYTES:
        return None
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("forkserver"),
                               initializer=worker_init)
    return Workers(pool, sources)


class _Writer:
    """Writes batches on background threads while the main thread reads and applies: one
    thread for SQL, one for Parquet (SQLite stepping and Parquet encoding release the GIL).
    At most two batches wait per sink, so memory stays bounded; an error surfaces at the
    next submit or at drain()."""

    def __init__(self, sink: SqlSink, pq_sink: ParquetSink | None, conn, run: str,
                 observe: Callable[[Batch], None]) -> None:
        sql = ThreadPoolExecutor(max_workers=1, thread_name_prefix="steptail-sql")

        def write_sql(batch: Batch) -> None:
            refused = sink.write(conn, run, batch)
            observe(batch.without(r for _, r, _ in refused) if refused else batch)

        self.lanes = [(sql, write_sql, deque())]
        self.submitted = 0  # batches handed to the lanes
        if pq_sink is not None:
            pq = ThreadPoolExecutor(max_workers=1, thread_name_prefix="steptail-parquet")
            self.lanes.append((pq, pq_sink.write, deque()))

    def submit(self, batch) -> None:
        self.submitted += 1
        for pool, write, pending in self.lanes:
            while len(pending) >= 2:
                pending.popleft().result()
            pending.append(pool.submit(write, batch))

    def drain(self) -> None:
        for _, _, pending in self.lanes:
            while pending:
                pending.popleft().result()

    def close(self) -> None:
        for pool, _, pending in self.lanes:
            for f in pending:
                f.cancel()
            pool.shutdown(wait=True)

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _flush(model, writer: _Writer) -> None:
    writer.submit(model.take())

