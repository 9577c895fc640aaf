"""Live alerts for `follow`: every new finding goes to a log line (its fields on the record,
top-level keys under `--log-format json`: steptail.logs), to optional webhooks (JSON POST
through a durable outbox, retried with backoff until delivered, each finding sent once per
webhook) and to the Prometheus metrics (steptail.collector.notify.metrics).

Typical use (inside the follower's event loop):

    metrics = Metrics()
    alerter = Alerter(webhooks=["https://hooks.example/x"], metrics=metrics, store=store)
    alerter.start()                                  # also sends what an earlier run left pending
    with store.engine.begin() as conn:               # the findings and their deliveries: one commit
        save_findings(conn, found); alerter.record(conn, found)
    await alerter.publish(found, recorded=True)      # log, count, wake the delivery worker
    await alerter.close()
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable

import sqlalchemy as sa

from steptail.collector.notify.metrics import Metrics
from steptail.collector.notify.webhooks import DeliveryWorker
from steptail.runs.findings import ACTIONABLE, CRITICAL, INFO, Finding, finding_id
from steptail.storage.db import Store
from steptail.storage.outbox import MemoryOutbox, Row, SqlOutbox

log = logging.getLogger("steptail.alerts")


def _log(f: Finding) -> None:
    """One line per finding: its detail as the message, its fields as the record's (top-level
    keys under `--log-format json`, steptail.logs), at CRITICAL, WARNING or INFO as its severity."""
    level = {CRITICAL: logging.CRITICAL, INFO: logging.INFO}.get(f.severity, logging.WARNING)
    log.log(level, "%s", f.detail, extra={"event": "finding", "id": finding_id(f), **f.to_event()})


class Alerter:
    """Publishes findings once each (by key: a range finding that grows is not re-sent).

    Webhook deliveries go through an outbox (steptail.storage.outbox): with a store, the
    alert_outbox table, written by record() in the transaction that stores the findings, so
    they survive a crash and a dead receiver; without one, memory. A background worker
    (steptail.collector.notify.webhooks) sends them; publish() never waits on the network. A delivery is retried on connection errors, timeouts, 408, 429
    and 5xx with exponential backoff (backoff, 2 x backoff, … capped at max_backoff) until it
    is delivered; other answers are final."""

    def __init__(
        self,
        webhooks: Iterable[str] = (),
        metrics: Metrics | None = None,
        *,
        store: Store | None = None,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        timeout: float = 10.0,
        per_webhook: int = 4,
        poll: float = 5.0,
    ) -> None:
        self.webhooks = list(dict.fromkeys(webhooks))
        self.metrics = metrics
        self.outbox: SqlOutbox | MemoryOutbox = SqlOutbox(store) if store is not None else MemoryOutbox()
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

    def _rows(self, findings: Iterable[Finding]) -> list[Row]:
        """Outbox rows of the findings that ask for action: an info finding (noted, nothing to
        do: docs/verdicts.md) is logged and stored, never sent to a webhook."""
        now = time.time_ns()
        rows = []
        for f in findings:
            if f.severity not in ACTIONABLE:
                continue
            payload = json.dumps({"id": finding_id(f), **f.to_event(),
                                  "text": f"[{f.severity}] {f.run}: {f.kind}: {f.detail}"})
            rows += [(finding_id(f), h.key, h.name, f.run, payload, now) for h in self.deliveries.hooks]
        return rows

    def record(self, conn: sa.Connection, findings: list[Finding]) -> None:
        """In the transaction that stores `findings`: one outbox row per (finding, webhook); a
        finding already there (a range that grew) is not added again. Thread-safe."""
        if self.webhooks and self.outbox.durable and findings and (rows := self._rows(findings)):
            self.outbox.add(conn, rows)

    async def publish(self, findings: Iterable[Finding], *, recorded: bool = False) -> list[Finding]:
        """Log, count and hand to the webhooks every finding not published before; returns those.
        recorded: record() already put them in the outbox with the findings' commit."""
        new = []
        for f in findings:
            if f.key in self._published:
                continue
            self._published.add(f.key)
            new.append(f)
            _log(f)
            if self.metrics is not None:
                self.metrics.finding(f)
        if self.webhooks and any(f.severity in ACTIONABLE for f in new):
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
