"""The one place where the live path hands data to the detectors (through the adapter
ingest uses too, steptail.storage.findings.FindingsFeed) and the alerts (steptail.collector.notify.alerts, .metrics): committed batches, stream gaps, follower
failures, the clock. Stream failures are also kept here (with their reason) for the view and
the demo."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from steptail.collector.notify import events
from steptail.collector.notify.alerts import Alerter
from steptail.collector.notify.metrics import Metrics
from steptail.runs.detectors import FindingEngine
from steptail.runs.findings import (
    AUTH_FAILURE,
    PARQUET_FAILURE,
    STREAM_FAILURE,
    UNREAD_TAIL,
    Finding,
    Settings,
)
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


def failure_kind(kind: str) -> str:
    """The finding of a follower or discovery failure: refused credentials (401) and denied
    permissions (403) are auth failures, anything else keeps the log from being read."""
    if kind == "parquet":  # the log is read and SQL has the rows; only Parquet lags
        return PARQUET_FAILURE
    if kind == UNREAD_TAIL:  # a pod deleted while the collector was down
        return kind
    return AUTH_FAILURE if kind in ("auth", "forbidden") else STREAM_FAILURE


def _seed_metrics(metrics: Metrics, store: Store, run: str) -> None:
    """The run's last stored step in the step gauges from the start: a collector that resumes
    or takes over a stalled run shows how old its last step is (no step to read, no gauge)."""
    last = last_recorded(store, run)
    if last is not None and last[1] is not None:  # no timestamp: no honest time to show
        metrics.step(run, last[0], last[1])


class Detectors:
    def __init__(self, run: str, store: Store | None = None, alerts: Alerter | None = None,
                 metrics: Metrics | None = None, settings: Settings | None = None,
                 reference_ce: dict[int, float] | None = None, on_event: events.Hook | None = None) -> None:
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
        # The follower says (heard, paused; the stall clock, FindingEngine.tick): wall time until which the
        # stream is known to have held back nothing, and whether the collector was just not
        # running (a pause: judged again only from now on).
        self.heard_ns: int | None = None
        self._paused = False
        self.on_event = on_event
        self._lock = threading.Lock()

    # -- inputs ------------------------------------------------------------------------------
    def observe(self, batch, gaps) -> list:
        return self.feed.observe(batch, gaps) if self.feed is not None else []

    def failure(self, kind: str, reason: str, at: tuple[int, int | None] | None = None) -> None:
        # the engine is used from the commit thread only: queue, handled at the next tick
        with self._lock:
            self.failures.append(Failure(kind, reason, time.time_ns(), at))

    def cluster_findings(self, findings: list[Finding]) -> None:
        """Runbook rules broken by the live JobSet (collector.live.runbook_live): handled at
        the next tick, on the commit thread like everything the engine sees."""
        with self._lock:
            self.cluster.extend(findings)

    def heard(self, ns: int) -> None:
        """The follower's word: until `ns` (wall time) the stream held back nothing."""
        self.heard_ns = ns

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
                out += feed.guard(feed.engine.observe_failure, failure_kind(f.kind), f.reason, f.at_ns, f.at) or []
            if cluster:
                out += feed.guard(feed.engine.observe_cluster, cluster) or []
            if self.finishing:
                self.finishing = False
                out += feed.finish()
            out += feed.guard(feed.engine.tick, now_ns, running and not paused, self.heard_ns) or []
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
        """After the commit: remember and alert (publishing wakes the delivery worker; it never
        waits on the network)."""
        if not findings:
            return
        self.flagged += findings
        events.committed_findings(self.on_event, findings)
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
