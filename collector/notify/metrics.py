"""The Prometheus metrics of `follow`, in their own registry, and the HTTP server that exposes
them (GET /metrics; /healthz: ready once discovery listed pods; /livez).

    metrics = Metrics()
    server = MetricsServer(metrics, port=9464, ready=lambda: sup.discovery.listed); await server.start()
    metrics.run_started(run, status)           # every counter of the run at 0 (collector.live.supervisor)
    metrics.step(run, last_step); metrics.reconnect(run, "eof"); metrics.bad_lines(run, n)
    metrics.error(run, "follower", "auth"); metrics.up(run, "follower", False)   # collector.notify.health
    metrics.finding(f)                                                            # collector.notify.alerts
    metrics.owned(n); metrics.run_stopped(run)  # replicas: runs this one holds, one handed over
    await server.stop()

Names follow Prometheus' conventions and are shared with `serve` (steptail.http), which
exposes the same facts from the store: `steptail_last_step`, `steptail_last_step_timestamp_seconds`.
Counters of a run exist at 0 from its start (an `increase()` rule sees its first finding);
no `_created` series.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)

from steptail.runs.findings import COLLECTOR_FAULTS, KINDS, Finding
from steptail.runs.gaps import GAP, HEAD_GAP

MISSING_KINDS = (GAP, HEAD_GAP)  # steptail.runs.gaps: the one definition of a missing step
RECONNECT_REASONS = ("eof", "silence")  # collector.live.follower
# A run is done once its follower is (--until-done), or while process 0 completed and its log
# was read to the end (collector.live.follower's state then): never a stall, whatever its age.
COMPLETED_STATE = "container Completed; waiting"
# The failures counted from 0 for each run (the alert rules match auth and forbidden):
# kubectl's kinds (collector.cluster.kubectl.classify; a 403 is "auth" there) and the store's.
RUN_ERRORS = (("follower", "auth"), ("follower", "network"), ("follower", "server_error"), ("store", "store"),
              ("stream content", "unreadable"))
DISCOVERY_ERRORS = ("auth", "forbidden", "network", "server_error", "deserialize")


class Metrics:
    """The Prometheus metrics of the follower, in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None, replicas: bool = True) -> None:
        """`replicas`: the store is shared (PostgreSQL), so the ownership gauge means something;
        on SQLite it is not exported at all (a `== 0` rule must not fire on every collector)."""
        disable_created_metrics()  # process-wide: no counter grows a _created series
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.last_step = Gauge("steptail_last_step", "Last step recorded (LOSS-PARTS).", ["run"], registry=r)
        self.last_step_timestamp = Gauge(
            "steptail_last_step_timestamp_seconds", "Unix time of the last recorded step: its kubelet "
            "timestamp, else when it was recorded.", ["run"], registry=r)
        self.run_done = Gauge(
            "steptail_run_done", "1 once the run's process 0 completed and its log is read to the end, else 0.",
            ["run"], registry=r)
        self.runs_owned = Gauge("steptail_runs_owned", "Runs this collector holds (replicas share the runs).",
                                registry=r)
        # prometheus_client adds the _total suffix to counters.
        self.missing_steps = Counter(
            "steptail_missing_steps", "Steps missing from the log (gap and head_gap findings).", ["run"], registry=r)
        self.findings = Counter("steptail_findings", "Findings raised, by kind.", ["run", "kind"], registry=r)
        self.webhook_deliveries = Counter(
            "steptail_webhook_deliveries", "Findings delivered to a webhook (2xx answers).", ["webhook"], registry=r)
        self.webhook_failures = Counter(
            "steptail_webhook_failures", "Webhook attempts that failed, by reason (timeout, connect, http_<status>).",
            ["webhook", "reason"], registry=r)
        self.webhook_pending = Gauge(
            "steptail_webhook_pending", "Deliveries waiting in the alert outbox.", ["webhook"], registry=r)
        self.stream_reconnects = Counter(
            "steptail_stream_reconnects", "Log stream reconnects, by reason.", ["run", "reason"], registry=r)
        self.bad_lines_total = Counter(
            "steptail_bad_lines", "Tagged lines that could not be read.", ["run"], registry=r)
        self.errors = Counter(
            "steptail_errors", "Failed attempts, by source (discovery, follower, store) and reason (auth, "
            "forbidden, network, deserialize, server_error, store, …); run is empty for discovery.",
            ["run", "source", "reason"], registry=r)
        # the collector's own faults (collector.notify.collector_events): health, not findings of a run
        self.collector_events = Counter(
            "steptail_collector_events", "Collector events started: a source of the collector failing until "
            "it works again (auth_failure, stream_failure, parquet_failure); run is empty for pod discovery. "
            "Not findings of the run: one that lost steps is named on the run's gap finding.",
            ["run", "kind"], registry=r)
        self.collector_events_open = Gauge(
            "steptail_collector_events_open", "Collector events not cleared yet, by kind.", ["kind"], registry=r)
        self.pauses = Counter(
            "steptail_collector_pauses", "Times this collector was not running for over a second (stopped, "
            "starved: its event loop's clock jumped); stalls are not judged over that time.", registry=r)
        self.follower_up = Gauge(
            "steptail_follower_up", "1 while the run's follower and store writes work, 0 while one fails.",
            ["run"], registry=r)
        self.ownership_up = Gauge(
            "steptail_ownership_up", "1 while this replica's ownership connection to PostgreSQL works (replicas "
            "share the runs through it), 0 while it fails: its runs stop until it is back. Absent on SQLite.",
            registry=r) if replicas else None
        self.discovery_up = Gauge(
            "steptail_discovery_up", "1 while process-0 pods are listed and watched, 0 before and while failing.",
            registry=r)
        self._down: dict[str, set[str]] = {}  # run -> its failing sources
        self._followed: set[str] = set()  # runs started and not stopped here
        for reason in DISCOVERY_ERRORS:
            self.errors.labels("", "discovery", reason)
        for kind in COLLECTOR_FAULTS:
            self.collector_events.labels("", kind)
            self.collector_events_open.labels(kind).set(0)

    def run_started(self, run: str, status=None) -> None:
        """A run is followed from now: its counters exist at 0 (again a no-op for one that
        exists); `status` (its RunStatus) tells when it is done."""
        for kind in KINDS:
            self.findings.labels(run, kind)
        self.missing_steps.labels(run)
        self.bad_lines_total.labels(run)
        for reason in RECONNECT_REASONS:
            self.stream_reconnects.labels(run, reason)
        for source, reason in RUN_ERRORS:
            self.errors.labels(run, source, reason)
        for kind in COLLECTOR_FAULTS:
            self.collector_events.labels(run, kind)
        self._followed.add(run)
        self.runs_owned.set(len(self._followed))  # one store, one collector: it holds what it follows
        done = self.run_done.labels(run)
        if status is not None:
            done.set_function(lambda: 1.0 if status.done or status.state == COMPLETED_STATE else 0.0)

    def run_stopped(self, run: str) -> None:
        """This collector no longer follows `run` (handed to another replica): its series go,
        so no rule sees a stale last step here."""
        by_run = ("run",)
        for metric, names in ((self.last_step, by_run), (self.last_step_timestamp, by_run),
                              (self.run_done, by_run), (self.missing_steps, by_run),
                              (self.findings, ("run", "kind")), (self.stream_reconnects, ("run", "reason")),
                              (self.bad_lines_total, by_run), (self.errors, ("run", "source", "reason")),
                              (self.follower_up, by_run), (self.collector_events, ("run", "kind"))):
            _remove_run(metric, names, run)
        self._down.pop(run, None)
        self._followed.discard(run)
        self.runs_owned.set(len(self._followed))

    def owned(self, n: int) -> None:
        """How many runs this collector holds now (replicas: what their locks say)."""
        self.runs_owned.set(n)

    def step(self, run: str, step: int, at_ns: int | None = None) -> None:
        """A new step of `run` was recorded (at_ns: its timestamp; default now)."""
        self.last_step.labels(run).set(step)
        self.last_step_timestamp.labels(run).set((time.time_ns() if at_ns is None else at_ns) / 1e9)

    def reconnect(self, run: str, reason: str) -> None:
        self.stream_reconnects.labels(run, reason).inc()

    def bad_lines(self, run: str, n: int = 1) -> None:
        if n > 0:
            self.bad_lines_total.labels(run).inc(n)

    def paused(self) -> None:
        self.pauses.inc()

    def error(self, run: str, source: str, reason: str) -> None:
        self.errors.labels(run, source, reason).inc()

    def up(self, run: str, source: str, up: bool) -> None:
        """A source started or stopped failing (discovery, ownership: their gauges, else the run's)."""
        if source == "discovery":
            self.discovery_up.set(1 if up else 0)
            return
        if source == "ownership":
            if self.ownership_up is not None:
                self.ownership_up.set(1 if up else 0)
            return
        if source in ("jobsets", "workloads"):  # the runbook's watches: counted in errors_total only
            return
        down = self._down.setdefault(run, set())
        if up:
            down.discard(source)
        else:
            down.add(source)
        self.follower_up.labels(run).set(0 if down else 1)

    def collector_events_now(self, run: str, started: str | None, open_by_kind: dict[str, int]) -> None:
        """A collector event of `run` started (its kind), or one cleared (None); the open ones now."""
        if started is not None:
            self.collector_events.labels(run, started).inc()
        for kind in {*COLLECTOR_FAULTS, *open_by_kind}:
            self.collector_events_open.labels(kind).set(open_by_kind.get(kind, 0))

    def finding(self, f: Finding) -> None:
        self.findings.labels(f.run, f.kind).inc()
        if f.kind in MISSING_KINDS:
            self.missing_steps.labels(f.run).inc(f.last_step - f.first_step + 1)

    def delivery(self, webhook: str, ok: bool, reason: str = "") -> None:
        """One webhook attempt (webhook: its redacted name, never the URL)."""
        if ok:
            self.webhook_deliveries.labels(webhook).inc()
        else:
            self.webhook_failures.labels(webhook, reason).inc()

    def outbox_pending(self, webhook: str, n: int) -> None:
        self.webhook_pending.labels(webhook).set(n)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _remove_run(metric, names: tuple[str, ...], run: str) -> None:
    """Every series of `metric` (labels `names`) for `run` removed; the label sets come from its
    own samples (prometheus_client's remove_by_labels is too recent to rely on)."""
    found = {tuple(s.labels[n] for n in names) for family in metric.collect() for s in family.samples
             if s.labels.get("run") == run}
    for values in found:
        metric.remove(*values)


class MetricsServer:
    """GET /metrics (Prometheus text format), /healthz (readiness: 503 until `ready()`, e.g.
    until discovery has listed pods once; the collector events open now, one line each after
    the status: they are health, ready all the same) and /livez (liveness: the event loop
    answers), on 127.0.0.1 unless told otherwise."""

    def __init__(self, metrics: Metrics, port: int = 0, host: str = "127.0.0.1",
                 ready: Callable[[], bool] | None = None, events: Callable[[], list] | None = None) -> None:
        self.metrics, self.host, self.port = metrics, host, port
        self.ready = ready or (lambda: True)
        self.events = events or list  # the open collector events (collector.notify.collector_events)
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        """Start serving; returns the bound port (useful with port 0)."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._health)
        app.router.add_get("/livez", self._live)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self.port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    async def _health(self, _request: web.Request) -> web.Response:
        try:
            ready = bool(self.ready())
        except Exception:  # noqa: BLE001 - a broken check is "not ready", never a 500
            ready = False
        text = "ok\n" if ready else "not ready: pods not listed yet\n"
        try:
            for ev in self.events():
                text += (f"collector event open: {ev.kind} ({ev.source}{' of ' + ev.run if ev.run else ''}) "
                         f"since {ev.to_dict()['started']}: {' '.join(ev.reason.split())}\n")
        except Exception as exc:  # noqa: BLE001 - the status line stands; say what failed
            text += f"collector events unavailable: {exc}\n"
        return web.Response(text=text, status=200 if ready else 503)

    async def _live(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")  # answered by the event loop: it is not blocked

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
