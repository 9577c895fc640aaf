"""The collector's own faults as health, not as findings of a run (docs/verdicts.md).

A source of a run (its follower, the stream's content, its buffer, its Parquet writes) or pod
discovery (every run) failing is one event from the moment it starts until it works again:
kind (auth_failure, stream_failure, parquet_failure), run ("" for discovery), started,
cleared, reason, failed attempts, and whether steps were lost in it. It is told by the
source's Health (a log line when it starts and one when it clears: collector.notify.health),
counted in metrics, listed by /healthz while open and in the follow summary, and stored
(storage.collector_events) for the API and the page. Only a fault that lost steps reaches
the run's findings: as the cause written on its gap finding (collector.live.follower)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from steptail.collector.notify.channel import Channel, CollectorEventTold
from steptail.runs.findings import AUTH_FAILURE, PARQUET_FAILURE, STREAM_FAILURE
from steptail.storage.collector_events import as_dict, record_events

log = logging.getLogger("steptail.health")

DISCOVERY = "discovery"
# The sources whose failures are collector events (the store's own and the ownership
# connection's are health of the store: their metric and log line, not these).
SOURCES = ("follower", "stream content", "buffer", "parquet", DISCOVERY)


def event_kind(source: str, kind: str) -> str:
    """The event of a source failing with `kind` (collector.cluster.kubectl.classify's, the
    sink's, the Parquet writer's): refused credentials (401) and denied permissions (403) are
    auth failures; Parquet's are Parquet's (SQL has the rows); anything else keeps the log
    from being read."""
    if source == "parquet" or kind == "parquet":
        return PARQUET_FAILURE
    return AUTH_FAILURE if kind in ("auth", "forbidden") else STREAM_FAILURE


@dataclass
class CollectorEvent:
    kind: str
    run: str  # "" for pod discovery
    source: str
    started_ns: int
    reason: str
    cleared_ns: int | None = None
    failures: int = 1
    lost_steps: bool = False

    @property
    def open(self) -> bool:
        return self.cleared_ns is None

    def row(self) -> tuple:
        return (self.run, self.kind, self.source, self.started_ns, self.cleared_ns, self.reason,
                self.failures, self.lost_steps)

    def to_dict(self) -> dict:
        return as_dict(*self.row())


class CollectorEvents:
    """Every event of this collector, the open one per (run, source), and those not stored yet.
    Told from the event loop and from threads (Parquet writes): one lock."""

    def __init__(self, metrics=None, channel: Channel | None = None) -> None:
        self.metrics = metrics  # collector.notify.metrics.Metrics
        self.channel = channel  # told when one starts, clears, lost steps (collector.notify.channel)
        self.events: list[CollectorEvent] = []
        self._open: dict[tuple[str, str], CollectorEvent] = {}
        self._dirty: dict[int, CollectorEvent] = {}  # id() -> event changed since the last save
        self._lock = threading.Lock()

    # -- told by the sources' Health ----------------------------------------------------------------
    def changed(self, run: str, source: str, kind: str | None, reason: str | None) -> None:
        """A source started failing or changed kind (`kind`), or works again (None)."""
        if source not in SOURCES:
            return
        run = "" if source == DISCOVERY else run
        now = time.time_ns()
        with self._lock:
            was = self._open.pop((run, source), None)
            if was is not None:
                was.cleared_ns = now
                self._mark(was)
            ev = None
            if kind is not None:  # the log lines of both ends are the source's Health's
                ev = CollectorEvent(event_kind(source, kind), run, source, now, (reason or "")[:600])
                self._open[(run, source)] = ev
                self.events.append(ev)
                self._mark(ev)
            still_open = self._counts()
        if self.metrics is not None:
            self.metrics.collector_events_now(run, ev.kind if ev is not None else None, still_open)
        for told in (was, ev):
            self._emit(told)

    def failed_again(self, run: str, source: str) -> None:
        """One more failed attempt in the open spell (counted, not logged)."""
        with self._lock:
            ev = self._open.get(("" if source == DISCOVERY else run, source))
            if ev is not None:
                ev.failures += 1
                self._mark(ev)

    def latest(self, run: str, source: str = "follower") -> CollectorEvent | None:
        """The run's newest event of `source` (open or cleared): the cause of what a re-read then finds lost."""
        with self._lock:
            return next((e for e in reversed(self.events) if e.run == run and e.source == source), None)

    def overlapping(self, run: str, start_ns: int, end_ns: int) -> CollectorEvent | None:
        """The newest event of the run's follower or of pod discovery open at some time from
        start_ns to end_ns (the window of a gap: what kept it from being read)."""
        with self._lock:
            return next((e for e in reversed(self.events)
                         if e.run in (run, "") and e.source in ("follower", DISCOVERY) and e.started_ns <= end_ns
                         and (e.cleared_ns is None or e.cleared_ns >= start_ns)), None)

    def lost(self, ev: CollectorEvent) -> None:
        """Steps were lost in `ev` (a gap finding names it as its cause)."""
        with self._lock:
            if ev.lost_steps:
                return
            ev.lost_steps = True
            self._mark(ev)
        log.warning("%s: collector event %s (started %s) lost steps: the gap finding names it",
                    ev.run or DISCOVERY, ev.kind, ev.to_dict()["started"])
        self._emit(ev)

    def _emit(self, ev: CollectorEvent | None) -> None:
        if ev is not None and self.channel is not None:
            self.channel.emit(CollectorEventTold(ev.to_dict()))

    # -- read ------------------------------------------------------------------------------------
    def open_events(self) -> list[CollectorEvent]:
        with self._lock:
            return list(self._open.values())

    def of(self, run: str) -> list[CollectorEvent]:
        """A run's events and pod discovery's, oldest first."""
        with self._lock:
            return [e for e in self.events if e.run in (run, "")]

    def _counts(self) -> dict[str, int]:
        """Open events by kind (the metrics' gauge); under the lock."""
        out: dict[str, int] = {}
        for ev in self._open.values():
            out[ev.kind] = out.get(ev.kind, 0) + 1
        return out

    # -- stored ----------------------------------------------------------------------------------
    @property
    def unsaved(self) -> bool:
        return bool(self._dirty)

    def save(self, store) -> int:
        """Write the events changed since the last save (blocking: call on a thread). A failure
        raises and leaves them to the next save."""
        with self._lock:
            todo = dict(self._dirty)
            rows = [e.row() for e in todo.values()]
        if not rows:
            return 0
        with store.engine.begin() as conn:
            record_events(conn, rows)
        with self._lock:
            for key, ev in todo.items():
                if self._dirty.get(key) is ev and ev.row() in rows:  # unchanged since: saved
                    del self._dirty[key]
        return len(rows)

    def _mark(self, ev: CollectorEvent) -> None:
        self._dirty[id(ev)] = ev
