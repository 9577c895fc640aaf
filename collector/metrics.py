"""The Prometheus metrics of `follow`, in their own registry, and the HTTP server that exposes
them (GET /metrics, /healthz).

    metrics = Metrics()
    server = MetricsServer(metrics, port=9464); await server.start()
    metrics.step(run, last_step); metrics.reconnect(run, "eof"); metrics.bad_lines(run, n)
    metrics.error(run, "follower", "auth"); metrics.up(run, "follower", False)   # collector.health
    metrics.finding(f)                                                            # collector.alerts
    await server.stop()
"""

from __future__ import annotations

import time

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from steptail.runs.findings import Finding

MISSING_KINDS = ("gap", "head_gap")


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
