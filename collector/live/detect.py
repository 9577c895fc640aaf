"""The one place where the live path hands data to the detectors (through the adapter
ingest uses too, steptail.storage.findings.FindingsFeed) and the alerts
(steptail.collector.notify.alerts, .metrics): committed batches, stream gaps, follower
failures, the clock. Follower failures are also kept here (with their reason) for the view
and the demo; of them only an unread tail (data lost) is a finding of the run: the others are
collector events (collector.notify.collector_events), and one that lost steps is named on the
gap finding, which the events' book is then told (lost_steps)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from steptail.collector.notify.alerts import Alerter
from steptail.collector.notify.channel import Channel, FindingsCommitted
from steptail.collector.notify.metrics import Metrics
from steptail.runs.detect import Settings
from steptail.runs.detectors import FindingEngine
from steptail.runs.findings import (
    UNREAD_TAIL,
    UNREADABLE_LOG,
    Finding,
)
from steptail.runs.gaps import GAP, HEAD_GAP
from steptail.storage.db import Store
from steptail.storage.findings import FindingsFeed, load_engine, save_findings
from steptail.storage.status import last_recorded

log = logging.getLogger("steptail.follow")


@dataclass
class Failure:
    kind: str
    reason: str
    at_ns: int
    at: tuple[int, int | None] | None = None  # (incarnation, last step) the failure is after


def _engine(store: Store, run: str, settings: Settings | None = None,
            reference_ce: dict[int, float] | None = None) -> FindingEngine | None:
    """An engine that has replayed what the store holds for the run (a resumed collector
    neither re-alerts old findings nor misses a gap across the restart)."""
    try:
        return load_engine(store, run, settings, reference_ce)
    except Exception as exc:  # noqa: BLE001 - a broken detector must not stop following
        log.warning("findings engine unavailable: %s", exc)
        return None


def _seed_metrics(metrics: Metrics, store: Store, run: str) -> None:
    """The run's last stored step in the step gauges from the start: a collector that resumes
    or takes over a stalled run shows how old its last step is (no step to read, no gauge)."""
    last = last_recorded(store, run)
    if last is not None and last[1] is not None:  # no timestamp: no honest time to show
        metrics.step(run, last[0], last[1])


class Detectors:
    def __init__(self, run: str, store: Store | None = None, alerts: Alerter | None = None,
                 metrics: Metrics | None = None, settings: Settings | None = None,
                 reference_ce: dict[int, float] | None = None, channel: Channel | None = None,
                 collector_events=None) -> None:
        self.run = run
        self.metrics = metrics
        self.engine = _engine(store, run, settings, reference_ce) if store is not None else None
        self.feed = FindingsFeed(run, engine=self.engine) if self.engine is not None else None
        if metrics is not None and store is not None:  # a resumed run: its last step is known
            self._guard(_seed_metrics, metrics, store, run)
        self.alerts = alerts
        self.failures: list[Failure] = []
        self.flagged: list = []  # every finding raised by this collector
        self._seen_failures = 0  # failures handed to the engine so far
        self.cluster: list[Finding] = []  # read off the cluster's objects (runbook rules), queued
        self.finishing = False  # the run ended: end-of-data checks at the next commit
        # The follower says (heard, paused; the stall clock, FindingEngine.tick): the wall time of
        # its latest look that found nothing unread, the stamp of its latest line fed, and whether
        # the collector was just not running (a pause: judged again only from now on).
        self.heard_ns: int | None = None
        self.heard_stamp_ns: int | None = None
        self._paused = False
        self.channel = channel  # findings as they commit (collector.notify.channel)
        self._lock = threading.Lock()
        # the collector's events (collector.notify.collector_events.CollectorEvents), and the stream
        # gaps the follower recorded with one of them as their cause: a gap finding naming such a
        # gap marks its event as having lost steps
        self.collector_events = collector_events
        self._caused: list[tuple[str, object]] = []
        # every finding of the run by key, latest state (the store's, then this collector's): the
        # live view's counts by severity and stall state (collector.live.view)
        self.verdicts: dict[tuple, Finding] = dict(self.engine.findings) if self.engine is not None else {}

    # -- inputs ------------------------------------------------------------------------------
    def observe(self, batch, gaps) -> list:
        return self.feed.observe(batch, gaps) if self.feed is not None else []

    def failure(self, kind: str, reason: str, at: tuple[int, int | None] | None = None) -> None:
        # the engine is used from the commit thread only: queue, handled at the next tick
        with self._lock:
            self.failures.append(Failure(kind, reason, time.time_ns(), at))

    def caused(self, gap_reason: str, event) -> None:
        """The follower recorded a stream gap (this reason) in or right after collector event
        `event`: should a gap finding name it, the event lost steps."""
        if event is not None:
            self._caused.append((gap_reason, event))
            del self._caused[:-64]  # the recent ones: a gap finding follows its gap within a batch or two

    def cluster_findings(self, findings: list[Finding]) -> None:
        """Runbook rules broken by the live JobSet (collector.live.runbook_live): handled at
        the next tick, on the commit thread like everything the engine sees."""
        with self._lock:
            self.cluster.extend(findings)

    def heard(self, ns: int | None, stamp_ns: int | None = None) -> None:
        """The follower's word: until `ns` (wall time, a look at the pod) the stream held back
        nothing, and its latest line fed was stamped `stamp_ns` (the node's clock)."""
        self.heard_ns, self.heard_stamp_ns = ns, stamp_ns

    def finish(self) -> None:
        """Process 0 completed: the end-of-data checks run at the next commit."""
        self.finishing = True

    def paused(self) -> None:
        """The collector was not running for a while (SIGSTOP, a starved event loop): that time
        is not the trainer's; the next tick restarts the stall clock."""
        with self._lock:
            self._paused = True
        if self.metrics is not None:
            self._guard(self.metrics.paused)

    def tick(self, now_ns: int, running: bool = True) -> list:
        with self._lock:
            todo, self._seen_failures = self.failures[self._seen_failures:], len(self.failures)
            paused, self._paused = self._paused, False
            cluster, self.cluster = self.cluster, []
        out = []
        if (feed := self.feed) is not None:
            for f in todo:
                # the run's own output lost or unreadable; the others are collector events (health)
                if f.kind in (UNREAD_TAIL, UNREADABLE_LOG):
                    out += feed.guard(feed.engine.observe_failure, f.kind, f.reason, f.at_ns, f.at) or []
            if cluster:
                out += feed.guard(feed.engine.observe_cluster, cluster) or []
            if self.finishing:
                self.finishing = False
                out += feed.finish()
            out += feed.guard(feed.engine.tick, now_ns, running and not paused, self.heard_ns,
                              self.heard_stamp_ns) or []
        return out

    @property
    def has_queued(self) -> bool:
        return len(self.failures) > self._seen_failures or self.finishing or self._paused or bool(self.cluster)

    def step(self, step: int, ts_ns: int | None) -> None:
        if self.metrics is not None:
            self._guard(self.metrics.step, self.run, step, ts_ns)

    def bad_lines(self, n: int) -> None:
        if self.metrics is not None:
            self._guard(self.metrics.bad_lines, self.run, n)

    def reconnect(self, reason: str) -> None:
        if self.metrics is not None:
            self._guard(self.metrics.reconnect, self.run, reason)

    # -- outputs -----------------------------------------------------------------------------
    def save(self, conn, findings: list[Finding]) -> None:
        if findings:
            save_findings(conn, findings)
            if self.alerts is not None:  # their webhook deliveries commit with them (the outbox)
                self.alerts.record(conn, findings)

    async def committed(self, findings: list) -> None:
        """After the commit: remember, tell the channel, and alert (publishing wakes the
        delivery worker; it never waits on the network). The alerts are this class's own, not a
        listener's: their webhook deliveries commit with the findings (save)."""
        if not findings:
            return
        self.flagged += findings
        for f in findings:
            self.verdicts[f.key] = f
            if f.kind in (GAP, HEAD_GAP, UNREAD_TAIL) and self.collector_events is not None:
                for reason, ev in self._caused:
                    if reason in f.detail:
                        self.collector_events.lost(ev)
        if self.channel is not None:
            self.channel.emit(FindingsCommitted(self.run, findings))
        if self.alerts is not None:
            try:
                await self.alerts.publish(findings, recorded=True)
            except Exception as exc:  # noqa: BLE001
                log.warning("%s: alert publish failed: %s", self.run, exc)

    def _guard(self, fn, *args):
        """The metrics' calls: a failure is logged, never raised (the engine's: FindingsFeed)."""
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001
            log.warning("%s: detector %s failed: %s", self.run, getattr(fn, "__name__", fn), exc)
            return None
