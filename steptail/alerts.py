"""Live alerts for `follow`: every new finding goes to a structured log line, to optional
webhooks (JSON POST, retried with backoff, each finding sent once) and to Prometheus metrics
served over HTTP.

Typical use (inside the follower's event loop):

    metrics = Metrics()
    server = MetricsServer(metrics, port=9464); await server.start()
    alerter = Alerter(webhooks=["https://hooks.example/x"], metrics=metrics)
    await alerter.publish(engine.observe(batch))     # findings from FindingEngine
    metrics.step(run, last_step); metrics.reconnect(run, "eof"); metrics.bad_lines(run, n)
    await alerter.close(); await server.stop()
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from urllib.parse import urlsplit

import aiohttp
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
        self.stream_reconnects = Counter(
            "steptail_stream_reconnects", "Log stream reconnects, by reason.", ["run", "reason"], registry=r)
        self.bad_lines_total = Counter(
            "steptail_bad_lines", "Tagged lines that could not be read.", ["run"], registry=r)
        self._last_ns: dict[str, int] = {}

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

    def finding(self, f: Finding) -> None:
        self.findings.labels(f.run, f.kind).inc()
        if f.kind in MISSING_KINDS:
            self.missing_steps.labels(f.run).inc(f.last_step - f.first_step + 1)

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

    Webhook deliveries run in one background task per URL, in order; publish() never waits
    on the network. A delivery is retried on connection errors, timeouts, 408, 429 and 5xx
    with exponential backoff (backoff, 2 x backoff, … capped at max_backoff), `attempts` times
    in all; other 4xx answers are final."""

    def __init__(
        self,
        webhooks: Iterable[str] = (),
        metrics: Metrics | None = None,
        *,
        attempts: int = 6,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        timeout: float = 10.0,
    ) -> None:
        self.webhooks = list(webhooks)
        self.metrics = metrics
        self.attempts, self.backoff, self.max_backoff = max(1, attempts), backoff, max_backoff
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.sent: dict[str, int] = {url: 0 for url in self.webhooks}  # deliveries that succeeded
        self.failed: dict[str, int] = {url: 0 for url in self.webhooks}
        self._published: set[tuple] = set()
        self._queues: dict[str, asyncio.Queue] = {}
        self._workers: list[asyncio.Task] = []
        self._session: aiohttp.ClientSession | None = None

    async def publish(self, findings: Iterable[Finding]) -> list[Finding]:
        """Log, count and queue for the webhooks every finding not published before; returns those."""
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
            if self.webhooks:
                payload = {"id": finding_id(f), **f.to_event(),
                           "text": f"[{f.severity}] {f.run}: {f.kind}: {f.detail}"}
                for url in self.webhooks:
                    self._queue(url).put_nowait(payload)
        return new

    def _queue(self, url: str) -> asyncio.Queue:
        q = self._queues.get(url)
        if q is None:
            q = self._queues[url] = asyncio.Queue()
            self._workers.append(asyncio.create_task(self._worker(url, q)))
        return q

    async def _worker(self, url: str, q: asyncio.Queue) -> None:
        while True:
            payload = await q.get()
            try:
                ok = await self._deliver(url, payload)
                if ok:
                    self.sent[url] += 1
                else:
                    self.failed[url] += 1
            except Exception:  # never let one bad delivery stop the worker
                self.failed[url] += 1
                log.exception("webhook %s: delivery of %s failed", redact(url), payload["id"])
            finally:
                q.task_done()

    async def _deliver(self, url: str, payload: dict) -> bool:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        why = ""
        for attempt in range(self.attempts):
            if attempt:
                await asyncio.sleep(min(self.backoff * 2 ** (attempt - 1), self.max_backoff))
            try:
                async with self._session.post(url, json=payload) as resp:
                    if 200 <= resp.status < 300:
                        return True
                    why = f"HTTP {resp.status}"
                    if resp.status < 500 and resp.status not in (408, 429):
                        break
            except (aiohttp.ClientError, TimeoutError) as exc:
                why = type(exc).__name__
            log.warning(json.dumps({"event": "webhook_retry", "webhook": redact(url), "id": payload["id"],
                                    "attempt": attempt + 1, "reason": why}))
        log.error(json.dumps({"event": "webhook_failed", "webhook": redact(url), "id": payload["id"],
                              "reason": why}))
        return False

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued delivery is done (delivered or given up); False on timeout."""
        joins = [q.join() for q in self._queues.values()]
        if not joins:
            return True
        try:
            await asyncio.wait_for(asyncio.gather(*joins), timeout)
        except TimeoutError:
            return False
        return True

    async def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (bounded by `timeout`), then stop the workers."""
        await self.flush(timeout)
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers.clear()
        self._queues.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None
