"""A run's sinks on the live path: SQL in small transactions (rows, cursors, stream gaps and
findings together, so a SIGKILL loses nothing committed and repeats nothing), then the rows
committed handed to Parquet (collector/live/parquet_feed.py: row groups flushed periodically
and at shutdown).

Batches are taken from the model on the event loop and written on a worker thread. The
model's Cursor objects keep moving while a write is in flight, so each batch carries a copy."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from steptail.collector.live.lake_feed import LakeFeed, LakeWriter
from steptail.collector.live.parquet_feed import ParquetFeed
from steptail.collector.notify.channel import Channel, GapsCommitted, RowsCommitted
from steptail.collector.notify.health import Health
from steptail.runs.model import Batch, RunModel
from steptail.runs.rows import LOSS_PARTS, POD_METRICS
from steptail.runs.stream_gap import StreamGap
from steptail.storage.db import Store
from steptail.storage.raw import RawChunk, RawLog
from steptail.storage.replicas import NotOwner
from steptail.storage.run_files import record_file
from steptail.storage.sql import SqlSink
from steptail.storage.streams import record_reconnects, record_stream_gaps

log = logging.getLogger("steptail.follow")
# A store that refuses writes is retried after 0.2 s, then twice as long each time up to 5 s
# (not at every ~50 ms flush); the rows wait in memory meanwhile.
RETRY_FIRST, RETRY_MAX = 0.2, 5.0
# Rows of one run that may wait in memory for the store (an outage, a failover): about 20 MB,
# a quarter of an hour at 40 lines/s. Past it the follower stops reading (`full`) until a
# commit succeeds: the lines wait in the pod's log, and are lost only if the pod is deleted
# meanwhile (then a stream gap says so). docs/follow.md: "A store outage is waited out".
BUFFER_ROWS = 20_000


class RunSink:
    """Commits one run's rows; a failed commit is kept and retried, in order, next time.
    While the store is away the rows wait here, up to `buffer_rows` (then `full` pauses the
    follower); with replicas every commit is fenced (`fence`), so rows that waited through an
    outage are committed only if no other replica took the run meanwhile."""

    # SQLite has one writer: serialise the threads rather than meet "database is locked".
    _sqlite_lock = threading.Lock()

    def __init__(self, store: Store, run: str, parquet_root: str | LakeWriter | None, detectors,
                 parquet_every: float = 30.0, jobset: str | None = None, namespace: str | None = None,
                 source: str | None = None, append: bool = False, *, status=None, fence=None,
                 on_lost=None, raw: RawLog | None = None, channel: Channel | None = None):
        """`detectors` (their metrics, if any, count the store's failures; `status` the run's);
        with replicas `fence(conn)` raises NotOwner once another replica took the run, and
        `on_lost(exc)` is told; `raw`: follow --raw's log; `channel`: rows and gaps as they commit."""
        self.store, self.run = store, run
        self.sql = SqlSink(store)
        self.detectors = detectors
        self.pending: list[tuple[Batch, list[StreamGap]]] = []
        self.gaps: list[StreamGap] = []
        self.reconnects: list[tuple] = []  # (run, stream, ts_ns, reason) not committed yet
        self.tick_every = 1.0  # stall checks run on the clock even when no line arrives
        self.last_tick = 0.0
        # while a stream of process 0 delivers (the follower says: delivering); stalls are judged only then
        self.running = False
        self.committed_rows = 0
        self.committed_steps = 0  # LOSS-PARTS rows of them (the live view counts steps, not rows)
        self.bad_lines = 0  # model.counters.bad_lines already reported to the metrics
        self.last_commit_ns: int | None = None
        self.error: str | None = None
        metrics = getattr(detectors, "metrics", None)
        self.health = Health("store", run, metrics, status)
        self.buffer_rows = BUFFER_ROWS
        self.buffer_health = Health("buffer", run, metrics, status)  # past the bound: reading paused
        self._committing_since: float | None = None  # a commit that hangs (a stalled connection) counts as failing
        self.retry_at = 0.0  # monotonic: while the store refuses writes, no commit before this
        self._retry_delay = 0.0
        self._unsaved: list = []  # findings of a commit that failed: the engine will not raise them again
        self.last_loss: tuple | None = None  # last LOSS-PARTS row committed
        self.channel = channel  # committed rows and gaps, as they commit (collector.notify.channel)
        self.step_seconds: float | None = None  # from the last per-pod step line
        self._lock = asyncio.Lock()
        # replicas (collector.live.ownership): each commit first checks the run is still ours; when it
        # is not, nothing is committed, ever again, and on_lost is told
        self.fence = fence  # callable(conn), raises NotOwner
        self.on_lost = on_lost  # callable(NotOwner)
        self.lost: NotOwner | None = None
        # follow --raw: the lines read, written to a segment before the rows they made commit
        self.raw = raw
        self.raw_pending: list[RawChunk] = []  # taken with the batches; written by _commit
        # the run's row (and its source's claim) commits with its first record, never before:
        # a namespace of 20,000 pods that print nothing makes no run
        self._run_row = (jobset, namespace, source, append)
        self._run_written = False
        told = lambda kind, reason: self.detectors.failure(kind, reason)  # noqa: E731
        if isinstance(parquet_root, LakeWriter):  # the lake: one writer for every run (collector.live.lake_feed)
            self.parquet = LakeFeed(parquet_root, run, told)
        else:
            self.parquet = ParquetFeed(store, run, parquet_root, parquet_every, told) if parquet_root else None
        # a full buffer and Parquet failing are collector events (health), not findings of the run
        book = getattr(detectors, "collector_events", None)
        self.buffer_health.events = book
        self.buffer_health.subscribe("detectors", lambda kind, reason: detectors.failure("buffer_full", reason),
                                     each=False)
        if self.parquet is not None:
            self.parquet.health.events = book
            self.error = self.parquet.catch_up()

    def delivering(self, running: bool) -> None:
        """The follower's word: a stream of process 0 delivers (True) or no longer does."""
        self.running = running

    def waiting(self, model: RunModel) -> int:
        """Rows read and not committed yet (the model's batch and the failed commits)."""
        return len(model.batch) + sum(len(b) for b, _ in self.pending)

    def full(self, model: RunModel) -> bool:
        """Whether reading must pause: the store refuses commits and `buffer_rows` rows wait
        for it (a backlog read while the store works is no reason). Said once when it starts
        (a log line, a metric, the summary, a stream_failure collector event) and once when a commit
        makes room again."""
        since = self._committing_since  # asked for every line read: the common case first
        stuck = since is not None and time.monotonic() - since > RETRY_MAX
        if (self.health.failing is None and not stuck) or (waiting := self.waiting(model)) < self.buffer_rows:
            if self.buffer_health.failing is not None:
                self.buffer_health.ok()
            return False
        reason = (f"{waiting} rows wait for the store (bound {self.buffer_rows}): reading paused until a "
                  "commit succeeds; lines written meanwhile wait in the pod's log")
        self.buffer_health.fail("full", reason)
        return True

    def add_gap(self, gap: StreamGap) -> None:
        self.gaps.append(gap)

    def add_reconnect(self, stream: str, reason: str) -> None:
        """A stream re-opened (silence, EOF): stored with the next commit, for the Fleet board."""
        self.reconnects.append((self.run, stream, time.time_ns(), reason))

    async def flush(self, model: RunModel, parquet: bool = False) -> int:
        """Commit what the model produced since the last flush; returns rows committed."""
        async with self._lock:
            if self.lost is not None:
                return 0
            batch = model.take()
            if self.raw is not None and (chunk := self.raw.take()) is not None:
                self.raw_pending.append(chunk)  # the lines of this batch's rows, and more
            gaps, self.gaps = self.gaps, []
            if self.reconnects:
                batch.reconnects, self.reconnects = self.reconnects, []
            if len(batch) or batch.incarnations or batch.cursors or gaps or batch.reconnects:
                self.pending.append((batch, gaps))  # take() copied the cursors
            written = 0
            ticking = time.monotonic() - self.last_tick >= self.tick_every or self.detectors.has_queued
            if (self.pending or ticking) and (parquet or time.monotonic() >= self.retry_at):
                self.last_tick = time.monotonic()
                todo = list(self.pending)
                self._committing_since = time.monotonic()
                try:
                    findings = await asyncio.to_thread(self._commit, todo)
                except NotOwner as exc:  # another replica follows the run now: it re-reads these
                    self.lost, self.pending, self.raw_pending = exc, [], []
                    if self.on_lost is not None:
                        self.on_lost(exc)
                    return 0
                except Exception as exc:  # noqa: BLE001 - keep following; retry next flush
                    why = str(exc).splitlines()[0][:200]
                    self.error = why if isinstance(exc, RawWriteFailed) else f"store write failed: {why}"
                    self.health.fail("store", self.error)  # one log line when it starts, not per retry
                    self._retry_delay = min(RETRY_MAX, max(RETRY_FIRST, self._retry_delay * 2))
                    self.retry_at = time.monotonic() + self._retry_delay
                    return 0
                finally:
                    self._committing_since = None
                self._retry_delay = 0.0
                self.error = None
                if self.health.ok():  # an outage ends: what was read meanwhile is in
                    log.info("%s: %d rows read while the store was away committed", self.run,
                             sum(len(b) for b, _ in todo))
                del self.pending[: len(todo)]
                self.raw_pending = [c for c in self.raw_pending if not c.written]
                self.last_commit_ns = time.time_ns()
                refused = self.sql.take_refused()  # quarantined by the store, the rest committed
                for table, _, why in refused:
                    model.counters.bad(f"store refused a {table} row (quarantined): {why}")
                for b, committed_gaps in todo:
                    b = b.without(r for _, r, _ in refused) if refused else b
                    if self.channel is not None:
                        self.channel.emit(RowsCommitted(self.run, b))
                        if committed_gaps:
                            self.channel.emit(GapsCommitted(self.run, committed_gaps))
                    written += len(b)
                    if b.loss_parts:
                        self.committed_steps += len(b.loss_parts)
                        self.last_loss = b.loss_parts[-1]
                        self.detectors.step(self.last_loss[LOSS_PARTS.STEP], self.last_loss[LOSS_PARTS.TS_NS])
                    if b.pod_metrics:
                        self.step_seconds = b.pod_metrics[-1][POD_METRICS.SECONDS]
                    if self.parquet is not None:
                        self.parquet.add(b)
                self.committed_rows += written
                bad = model.counters.bad_lines
                if bad > self.bad_lines:
                    self.detectors.bad_lines(bad - self.bad_lines)
                    self.bad_lines = bad
                if self.parquet is not None and (findings or any(g or b.reconnects for b, g in todo)):
                    self.parquet.snapshots_due = True
                await self.detectors.committed(findings)
            if self.parquet is not None and self.parquet.due(parquet):
                await self.parquet.write()
            return written

    async def stop(self, reason: str) -> None:
        """Commit nothing more: a commit in flight ends first; the rows still waiting are
        dropped (the run's next owner re-reads them from the pod)."""
        async with self._lock:
            if self.lost is None:
                self.lost = NotOwner(reason)
            self.pending, self.raw_pending = [], []

    def _commit(self, todo: list[tuple[Batch, list[StreamGap]]]) -> list:
        files = self._write_raw()  # first: no row is committed whose line is not in a segment
        try:
            return self._commit_rows(todo, files)
        except BaseException:
            if self.raw is not None:
                self.raw.restore_touched(files)  # recorded with the next commit
            raise

    def _write_raw(self) -> list:
        """The raw lines taken so far, fsynced (a chunk written before a failed SQL commit is
        not written again); the segments to record in run_files."""
        if self.raw is None:
            return []
        try:
            for chunk in self.raw_pending:
                self.raw.write(chunk)
        except OSError as exc:
            raise RawWriteFailed(f"raw log write failed: {exc}") from exc
        return self.raw.take_touched()

    def _commit_rows(self, todo: list[tuple[Batch, list[StreamGap]]], files: list) -> list:
        ticked = not todo and not files
        if ticked:  # only the clock's checks: a transaction only when they raised something
            self._unsaved += self.detectors.tick(time.time_ns(), self.running)
            if not self._unsaved:
                return []
        lock = self._sqlite_lock if self.store.is_sqlite else _NoLock()
        self.sql.take_refused()  # left by an attempt that was rolled back
        with lock, self.store.engine.begin() as conn:
            if self.fence is not None:
                self.fence(conn)
            findings = self._unsaved  # grows in place: kept if this commit fails too
            creating = not self._run_written and any(len(b) or b.incarnations or b.quarantine for b, _ in todo)
            if creating:
                jobset, namespace, source, append = self._run_row
                self.sql.ensure_run(conn, self.run, jobset, namespace, source=source, append=append)
            for f in files:
                record_file(conn, f)
            for batch, gaps in todo:
                refused = self.sql.write(conn, self.run, batch)
                batch = batch.without(r for _, r, _ in refused) if refused else batch  # the detectors: stored rows only
                if batch.reconnects:
                    record_reconnects(conn, batch.reconnects)
                if gaps:
                    record_stream_gaps(conn, [
                        (self.run, g.stream, g.start_ns, g.end_ns, g.reason, g.detected_ns) for g in gaps])
                findings += self.detectors.observe(batch, gaps)
            if not ticked:
                findings += self.detectors.tick(time.time_ns(), self.running)
            findings = list({f.key: f for f in findings}.values())  # a finding grown twice: its latest state
            self.detectors.save(conn, findings)
        self._unsaved = []
        self._run_written = self._run_written or creating
        return findings

    async def close_raw(self) -> None:
        """After the final flush: the raw segments closed (sha256) and recorded. A failure is
        logged: the segments are complete up to the last commit whatever happens."""
        if self.raw is None:
            return
        async with self._lock:
            if (chunk := self.raw.take()) is not None:
                self.raw_pending.append(chunk)
            try:
                await asyncio.to_thread(self._close_raw)
            except Exception as exc:  # noqa: BLE001 - reparse reads open segments too
                log.warning("%s: closing the raw log failed: %s", self.run, str(exc).splitlines()[0][:200])

    def _close_raw(self) -> None:
        files = self._write_raw()
        self.raw_pending = []
        self.raw.close()
        files += self.raw.take_touched()
        if not files or self.lost is not None:
            return
        lock = self._sqlite_lock if self.store.is_sqlite else _NoLock()
        with lock, self.store.engine.begin() as conn:
            if self.fence is not None:
                self.fence(conn)
            for f in {f.path: f for f in files}.values():  # the latest state of each
                record_file(conn, f)

    def compact_parquet(self) -> None:
        """At shutdown, after the final flush (ParquetFeed.compact)."""
        if self.parquet is not None:
            self.parquet.compact()


class RawWriteFailed(OSError):
    """The raw log could not be written: the rows wait uncommitted, retried like a store outage."""


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
