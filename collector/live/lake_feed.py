"""The runs' rows on the live path into the lake (storage.lake): one writer per follow gathers
what every run committed to SQL and appends it in one commit per table every `every` seconds
(and at shutdown), so commits grow with time, not with the number of runs. A run's findings,
stream gaps and reconnects replace its previous ones when they changed.

SQL holds every row first, so the lake may lag but never loses: after a failure (the bucket
unreachable) the rows held are dropped, the runs they belonged to are "behind", and the next
write catches each up from SQL (storage.catchup.catch_up_lake: keys SQL holds and the table
does not). The lake's append is exactly once by key, so catching up twice adds nothing.
A failure is said once per spell per run, as a parquet_failure collector event (health: the
run loses nothing)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from steptail.collector.notify.health import Health
from steptail.runs.model import Batch
from steptail.runs.rows import ROW_TABLES
from steptail.storage.catchup import catch_up_lake
from steptail.storage.compact import snapshot_table
from steptail.storage.db import Store
from steptail.storage.lake import Lake, as_lake_rows
from steptail.storage.parquet import SNAPSHOT_SCHEMAS, to_arrow

log = logging.getLogger("steptail.follow")
# A run's files of one table are rewritten as one after this many appends (~32 min at the
# default period): a reader of one run opens at most this many files, whatever its length.
COMPACT_AFTER = 64


class LakeWriter:
    """One per follow process: every run's rows, one commit per table per period."""

    def __init__(self, store: Store, lake: Lake, every: float) -> None:
        self.store, self.lake, self.every = store, lake, every
        self.rows: dict[str, dict[str, list[tuple]]] = {t: {} for t in ROW_TABLES}
        self.snapshots: set[str] = set()  # runs whose findings, gaps or reconnects changed
        self.behind: set[str] = set()  # runs whose rows were dropped: caught up from SQL
        self.failed: dict[str, str] = {}  # run -> why its last write failed
        self.parts: dict[tuple[str, str], int] = {}  # (table, run) -> files appended since compaction
        self.last = time.monotonic()
        self._lock = asyncio.Lock()
        self._thread_lock = threading.Lock()  # catch-ups at start run on other threads

    def add(self, run: str, batch: Batch) -> None:
        for t in ROW_TABLES:
            if rows := getattr(batch, t):
                self.rows[t].setdefault(run, []).extend(rows)

    def due(self, now: bool = False) -> bool:
        return now or time.monotonic() - self.last >= self.every

    async def write(self, now: bool = False) -> None:
        """Whatever every run holds, written on a thread when due; failures kept per run."""
        async with self._lock:
            if not self.due(now):
                return
            self.last = time.monotonic()
            rows, self.rows = self.rows, {t: {} for t in ROW_TABLES}
            snapshots, self.snapshots = self.snapshots, set()
            await asyncio.to_thread(self._write, rows, snapshots)

    def _write(self, rows: dict[str, dict[str, list[tuple]]], snapshots: set[str]) -> None:
        runs = {run for by_run in rows.values() for run in by_run} | snapshots | self.behind
        with self._thread_lock:
            for run in list(self.behind):  # their rows are in SQL: catch_up writes them with the missed ones
                if self._try(run, lambda run=run: catch_up_lake(self.store, run, self.lake)):
                    self.behind.discard(run)
            for table, by_run in rows.items():
                by_run = {r: v for r, v in by_run.items() if r not in self.behind}
                if by_run and self._try_all(by_run, lambda t=table, b=by_run: self.lake.append(
                        t, {r: as_lake_rows(t, r, to_arrow(t, v)) for r, v in b.items()})):
                    for r in by_run:
                        self.parts[(table, r)] = self.parts.get((table, r), 0) + 1
            for (table, run), n in list(self.parts.items()):
                if n >= COMPACT_AFTER and run not in self.behind:
                    del self.parts[(table, run)]
                    self._try(run, lambda t=table, r=run: self.lake.compact(t, r))
            due = [r for r in snapshots if r not in self.behind]
            if due:
                self._try_all(dict.fromkeys(due), lambda: self._snapshots(due))
        for run in runs - self.behind:
            self.failed.pop(run, None)

    def _snapshots(self, runs: list[str]) -> None:
        with self.store.engine.connect() as conn:
            data = {t: {r: as_lake_rows(t, r, snapshot_table(conn, t, r)) for r in runs} for t in SNAPSHOT_SCHEMAS}
        for table, by_run in data.items():
            self.lake.replace(table, by_run)

    def _try(self, run: str, fn: Callable[[], object]) -> bool:
        return self._try_all({run: None}, fn)

    def _try_all(self, runs: dict, fn: Callable[[], object]) -> bool:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - SQL has the rows: keep following
            reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            for run in runs:
                self.behind.add(run)
                self.failed[run] = reason
            return False
        return True

    def catch_up(self, run: str) -> str | None:
        """At a run's start: what SQL holds and the table lacks (a killed collector, a handover).
        The reason if that failed (then tried again at each write)."""
        try:
            with self._thread_lock:
                n = catch_up_lake(self.store, run, self.lake, snapshots=False)
            self.snapshots.add(run)  # replaced with the others' at the next write: one commit
        except Exception as exc:  # noqa: BLE001 - follow anyway; SQL has the rows
            error = f"lake catch-up failed: {str(exc).splitlines()[0][:200]}"
            log.warning("%s: %s", run, error)
            self.behind.add(run)
            self.failed[run] = error
            return error
        if n:
            log.info("%s: %d rows the lake lacked written from SQL", run, n)
        return None

    def compact(self, run: str) -> None:
        """At shutdown or handover, after the final write: nothing. A run's files are compacted
        while it is followed (every COMPACT_AFTER appends) and by `steptail compact`; compacting
        every run here would outlast the pod's grace period, and a run handed over goes on
        being written elsewhere."""


class LakeFeed:
    """One run's side of the LakeWriter, with the interface RunSink uses for a Parquet feed."""

    def __init__(self, writer: LakeWriter, run: str, on_failure: Callable[[str, str], None]) -> None:
        self.writer, self.run = writer, run
        self.health = Health("parquet", run)
        self.files = 0
        self.health.subscribe("detectors", on_failure, each=False)  # told when a spell starts

    @property
    def behind(self) -> bool:
        return self.run in self.writer.behind

    @property
    def snapshots_due(self) -> bool:
        return self.run in self.writer.snapshots

    @snapshots_due.setter
    def snapshots_due(self, due: bool) -> None:
        if due:
            self.writer.snapshots.add(self.run)
        else:
            self.writer.snapshots.discard(self.run)

    def catch_up(self) -> str | None:
        return self.writer.catch_up(self.run)

    def add(self, batch: Batch) -> None:
        self.writer.add(self.run, batch)

    def due(self, now: bool = False) -> bool:
        return self.writer.due(now)

    async def write(self) -> None:
        await self.writer.write(now=True)
        reason = self.writer.failed.get(self.run)
        if reason is None:
            self.health.ok()
        else:
            self.health.fail("parquet", reason)

    def compact(self) -> None:
        self.writer.compact(self.run)
