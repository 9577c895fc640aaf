"""Live alerts for `follow`: every new finding goes to a structured log line, to optional
webhooks (JSON POST through a durable outbox, retried with backoff until delivered, each
finding sent once per webhook) and to Prometheus metrics served over HTTP.

Typical use (inside the follower's event loop):

    metrics = Metrics()
    server = MetricsServer(metrics, port=9464); await server.start()
    alerter = Alerter(webhooks=["https://hooks.example/x"], metrics=metrics, store=store)
    alerter.start()                                  # also sends what an earlier run left pending
    with store.engine.begin() as conn:               # the findings and their deliveries: one commit
        save_findings(conn, found); alerter.record(conn, found)
    await alerter.publish(found, recorded=True)      # log, count, wake the delivery worker
    metrics.step(run, last_step); metrics.reconnect(run, "eof"); metrics.bad_lines(run, n)
    metrics.error(run, "follower", "auth"); metrics.up(run, "follower", False)   # collector.health
    await alerter.close(); await server.stop()
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from urllib.parse import urlsplit

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from steptail.findings.model import CRITICAL, Finding

log = logging.getLogger("steptail.alerts")
MISSING_KINDS = ("gap", "head_gap")


def redact(url: str) -> str:
    """scheme://host[:port] of a webhook URL: its path and query often carry the secret."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}{f':{parts.port}' if parts.port else ''}"


def finding_id(f: Finding) -> str:
    """Stable id of a finding, so a receiver can drop a retry whose first POST did arrive."""
    return f"{f.run}/{f.kind}/{f.incarnation}/{f.first_step}"


class Metrics:
    """The Prometheus metrics of the follower, in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.last_step = Gauge("steptail_last_step", "Last step recorded (LOSS-PARTS).", ["run"], registry=r)
        self.seconds_since_last_step = Gauge(
            "steptail_seconds_since_last_step", "Seconds since the last step was recorded.", ["run"], registry=r)
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
        self.follower_up = Gauge(
            "steptail_follower_up", "1 while the run's follower and store writes work, 0 while one fails.",
            ["run"], registry=r)
        self.discovery_up = Gauge(
            "steptail_discovery_up", "1 while process-0 pods are listed and watched, 0 before and while failing.",
            registry=r)
        self._last_ns: dict[str, int] = {}
        self._down: dict[str, set[str]] = {}  # run -> its failing sources

    def step(self, run: str, step: int, at_ns: int | None = None) -> None:
        """A new step of `run` was recorded (at_ns: when; default now)."""
        self.last_step.labels(run).set(step)
        first = run not in self._last_ns
        self._last_ns[run] = time.time_ns() if at_ns is None else at_ns
        if first:
            self.seconds_since_last_step.labels(run).set_function(
                lambda: (time.time_ns() - self._last_ns[run]) / 1e9)

    def reconnect(self, run: str, reason: str) -> None:
        self.stream_reconnects.labels(run, reason).inc()

    def bad_lines(self, run: str, n: int = 1) -> None:
        if n > 0:
            self.bad_lines_total.labels(run).inc(n)

    def error(self, run: str, source: str, reason: str) -> None:
        self.errors.labels(run, source, reason).inc()

    def up(self, run: str, source: str, up: bool) -> None:
        """A source started or stopped failing (discovery: the discovery gauge, else the run's)."""
        if source == "discovery":
            self.discovery_up.set(1 if up else 0)
            return
        down = self._down.setdefault(run, set())
        if up:
            down.discard(source)
        else:
            down.add(source)
        self.follower_up.labels(run).set(0 if down else 1)

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


class MetricsServer:
    """GET /metrics (Prometheus text format) and /healthz, on 127.0.0.1 unless told otherwise."""

    def __init__(self, metrics: Metrics, port: int = 0, host: str = "127.0.0.1") -> None:
        self.metrics, self.host, self.port = metrics, host, port
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        """Start serving; returns the bound port (useful with port 0)."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._health)
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
        return web.Response(text="ok\n")

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class Alerter:
    """Publishes findings once each (by key: a range finding that grows is not re-sent).

    Webhook deliveries go through an outbox (steptail.outbox): with a store, the alert_outbox
    table, written by record() in the transaction that stores the findings, so they survive a
    crash and a dead receiver; without one, memory. A background worker sends them; publish()
    never waits on the network. A delivery is retried on connection errors, timeouts, 408, 429
    and 5xx with exponential backoff (backoff, 2 x backoff, … capped at max_backoff) until it
    is delivered; other answers are final."""

    def __init__(
        self,
        webhooks: Iterable[str] = (),
        metrics: Metrics | None = None,
        *,
        store=None,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        timeout: float = 10.0,
        per_webhook: int = 4,
        poll: float = 5.0,
    ) -> None:
        from steptail.outbox import DeliveryWorker, MemoryOutbox, SqlOutbox

        self.webhooks = list(dict.fromkeys(webhooks))
        self.metrics = metrics
        self.outbox = SqlOutbox(store) if store is not None else MemoryOutbox()
        self.deliveries = DeliveryWorker(self.outbox, self.webhooks, metrics, timeout=timeout, backoff=backoff,
                                         max_backoff=max_backoff, per_webhook=per_webhook, poll=poll)
        self._published: set[tuple] = set()

    @property
    def sent(self) -> dict[str, int]:
        """Deliveries that succeeded in this process, per webhook URL."""
        return {h.url: h.sent for h in self.deliveries.hooks}

    @property
    def failed(self) -> dict[str, int]:
        """Deliveries the receiver refused for good (a 4xx other than 408/429), per webhook URL."""
        return {h.url: h.rejected for h in self.deliveries.hooks}

    def start(self) -> None:
        """Start sending (what an earlier run left pending, too). Needs a running loop."""
        self.deliveries.start(report_backlog=True)

    def _rows(self, findings: Iterable[Finding]) -> list[tuple]:
        now = time.time_ns()
        rows = []
        for f in findings:
            payload = json.dumps({"id": finding_id(f), **f.to_event(),
                                  "text": f"[{f.severity}] {f.run}: {f.kind}: {f.detail}"})
            rows += [(finding_id(f), h.key, h.name, f.run, payload, now) for h in self.deliveries.hooks]
        return rows

    def record(self, conn, findings: list[Finding]) -> None:
        """In the transaction that stores `findings`: one outbox row per (finding, webhook); a
        finding already there (a range that grew) is not added again. Thread-safe."""
        if self.webhooks and self.outbox.durable and findings:
            self.outbox.add(conn, self._rows(findings))

    async def publish(self, findings: Iterable[Finding], *, recorded: bool = False) -> list[Finding]:
        """Log, count and hand to the webhooks every finding not published before; returns those.
        recorded: record() already put them in the outbox with the findings' commit."""
        new = []
        for f in findings:
            if f.key in self._published:
                continue
            self._published.add(f.key)
            new.append(f)
            level = logging.ERROR if f.severity == CRITICAL else logging.WARNING
            log.log(level, json.dumps({"event": "finding", **f.to_event()}, sort_keys=True))
            if self.metrics is not None:
                self.metrics.finding(f)
        if self.webhooks and new:
            if not (recorded and self.outbox.durable):
                rows = self._rows(new)
                if self.outbox.durable:
                    await asyncio.to_thread(self.outbox.add_now, rows)
                else:
                    self.outbox.add_now(rows)
            self.deliveries.start()
            self.deliveries.wake()
        return new

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending for the webhooks (delivered or refused); False on timeout."""
        return await self.deliveries.flush(timeout)

    async def close(self, timeout: float = 10.0) -> int:
        """Deliver what is pending (bounded by `timeout`), then stop; what is still pending is
        logged in one line and, with a store, kept for the next start. Returns that count."""
        return await self.deliveries.close(timeout)
