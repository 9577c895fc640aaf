"""A run's Parquet on the live path: the rows SQL committed, held and written as one row group
per table every `every` seconds (and at shutdown); the run's snapshots (findings, stream gaps,
reconnects) rewritten when they changed; the parts compacted at shutdown.

SQL holds every row first, so Parquet may lag but never loses: after a failure (a full disk)
the rows held are dropped and catch_up writes them from SQL once it works again. A failure is
said once per spell, as a parquet_failure collector event: the log itself is read fine."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from steptail.collector.notify.health import Health
from steptail.runs.model import Batch
from steptail.runs.rows import ROW_TABLES
from steptail.storage.catchup import catch_up
from steptail.storage.compact import compact, write_snapshots
from steptail.storage.db import Store
from steptail.storage.parquet import ParquetSink

log = logging.getLogger("steptail.follow")


class ParquetFeed:
    def __init__(self, store: Store, run: str, root: str, every: float,
                 on_failure: Callable[[str, str], None]) -> None:
        """`on_failure(kind, reason)`: the detectors' failure, told when a spell starts."""
        self.store, self.run, self.root, self.every = store, run, root, every
        self.rows: dict[str, list[tuple]] = {t: [] for t in ROW_TABLES}
        self.last = time.monotonic()
        self.files = 0  # written by this collector
        self.health = Health("parquet", run)
        self.behind = False  # rows dropped after a failure: catch_up rewrites them from SQL
        self.snapshots_due = False  # findings, stream gaps or reconnects committed since the last write
        self.health.subscribe("detectors", on_failure, each=False)  # told when a spell starts

    def catch_up(self) -> str | None:
        """Rows a killed collector committed but never wrote here go here now; the reason if
        that failed (then tried again at each write)."""
        try:
            n = catch_up(self.store, self.run, self.root)
        except Exception as exc:  # noqa: BLE001 - follow anyway; SQL has the rows
            error = f"Parquet catch-up failed: {str(exc).splitlines()[0][:200]}"
            log.warning("%s: %s", self.run, error)
            self.behind = True
            return error
        if n:
            log.info("%s: %d rows committed before a restart written to Parquet", self.run, n)
        return None

    def add(self, batch: Batch) -> None:
        """Rows just committed to SQL."""
        for t in ROW_TABLES:
            self.rows[t].extend(getattr(batch, t))

    def due(self, now: bool = False) -> bool:
        return now or time.monotonic() - self.last >= self.every

    async def write(self) -> None:
        """What is held, written (on a thread); a failure is kept, never raised."""
        try:
            await asyncio.to_thread(self._write)
        except Exception as exc:  # noqa: BLE001 - SQL has the rows: keep following
            self._failed(exc)
        else:
            self.health.ok()

    def _write(self) -> None:
        self.last = time.monotonic()
        rows, self.rows = self.rows, {t: [] for t in ROW_TABLES}
        if self.behind:  # these rows are in SQL too: catch_up writes them with the missed ones
            catch_up(self.store, self.run, self.root)  # the snapshots too
            self.behind = self.snapshots_due = False
            return
        if self.snapshots_due:
            write_snapshots(self.store, self.run, self.root)
            self.snapshots_due = False
        if not any(rows.values()):
            return
        sink = ParquetSink(self.root, self.run)
        try:
            sink.write(Batch(**rows))  # one row group per table for the whole period
            self.files += len(sink.commit())
        except Exception:
            sink.abort()
            raise

    def compact(self) -> None:
        """At shutdown, after the final write: the run's parts become one file per table.
        A failure leaves the parts as they were (readable), so it is only logged."""
        if self.behind:
            return
        try:
            compact(self.root, self.run)
        except Exception as exc:  # noqa: BLE001 - the parts stay readable as they are
            log.warning("%s: Parquet compaction failed: %s", self.run, str(exc).splitlines()[0][:200])

    def _failed(self, exc: Exception) -> None:
        """Memory does not hold the rows until it works again (catch_up writes them then)."""
        self.behind = True
        self.rows = {t: [] for t in ROW_TABLES}
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        self.health.fail("parquet", reason)
