"""Webhook deliveries: the worker that empties the alert outbox (steptail.storage.outbox).

The worker POSTs each row (the payload's `id` is the finding id: the receiver's idempotency
key) and marks it delivered on a 2xx answer. Connection errors, timeouts, 408, 429 and 5xx are
retried until the row is delivered, in this process and after it: what is pending at exit, or
at a SIGKILL, stays in the outbox and is sent by the next collector that uses the same store
and webhook. Any other answer is final (`rejected`).

A failing webhook is probed one request at a time with exponential backoff (capped); a healthy
one gets a few requests at once. Every request has a timeout and the worker runs on its own
task, so a dead or hanging receiver never slows the commits of the follower.

Store calls run in a thread (SqlOutbox); the memory outbox is called directly."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import aiohttp

from steptail.collector.notify.metrics import Metrics
from steptail.storage.outbox import (
    DELIVERED,
    HOST_MAX,
    PENDING,
    REJECTED,
    Delivery,
    MemoryOutbox,
    SqlOutbox,
    redact,
    webhook_key,
)

log = logging.getLogger("steptail.alerts")

OK, RETRY, REJECT = "ok", "retry", "reject"


@dataclass
class Hook:
    """One webhook and how it is doing."""

    url: str
    key: str
    name: str  # redacted: for logs and metric labels
    inflight: set[int] = field(default_factory=set)
    failures: int = 0  # consecutive failed attempts
    failing_since: float | None = None  # monotonic
    retry_at: float = 0.0  # monotonic: next probe while failing
    sent: int = 0
    rejected: int = 0


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectionError):
        return "connect"
    return "error"


class DeliveryWorker:
    """Sends what the outbox holds for `urls`, on its own task (start), until close."""

    def __init__(self, outbox: SqlOutbox | MemoryOutbox, urls: list[str], metrics: Metrics | None = None,
                 *, timeout: float = 10.0,
                 backoff: float = 0.5, max_backoff: float = 30.0, per_webhook: int = 4,
                 poll: float = 5.0) -> None:
        self.outbox, self.metrics = outbox, metrics
        self.hooks: list[Hook] = []
        names: set[str] = set()
        for url in urls:
            name = redact(url)
            if name in names:  # two webhooks on one host: still told apart, without the secret
                name = f"{name}#{webhook_key(url)[:8]}"
            names.add(name)
            self.hooks.append(Hook(url, webhook_key(url), name[:HOST_MAX]))
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        # Longer than one attempt can take: a row is never in flight in two collectors at once.
        self.lease_ns = int((2 * timeout + 5) * 1e9)
        self.backoff, self.max_backoff = backoff, max_backoff
        self.per_webhook, self.poll = max(1, per_webhook), poll
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._sends: set[asyncio.Task] = set()
        self._session: aiohttp.ClientSession | None = None
        self._store_error: str | None = None
        self._last_gauge = 0.0

    # -- control -----------------------------------------------------------------------------
    def start(self, report_backlog: bool = False) -> None:
        """report_backlog: log what an earlier run left pending (only before anything is added)."""
        if self._task is None and self.hooks:
            self._task = asyncio.get_running_loop().create_task(self._run(report_backlog), name="webhook-deliveries")

    def wake(self) -> None:
        self._wake.set()

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending for these webhooks; False on timeout."""
        if not self.hooks:
            return True
        self.start()
        keys = {h.key for h in self.hooks}

        async def drained() -> None:
            while True:
                if not any(h.inflight for h in self.hooks):
                    try:
                        counts = await self._io(self.outbox.pending)
                    except Exception as exc:  # noqa: BLE001 - the store is down: not drained, wait on
                        self._store_failed(exc)
                        counts = {k: 1 for k in keys}
                    if not any(counts.get(k) for k in keys):
                        return
                await asyncio.sleep(0.05)

        try:
            async with asyncio.timeout(timeout):  # not wait_for: on 3.11 it can swallow a cancel
                await drained()
        except TimeoutError:
            return False
        return True

    async def close(self, timeout: float = 10.0) -> int:
        """Deliver what is pending (bounded by `timeout`), stop; returns what is still pending."""
        if not self.hooks:
            return 0
        if self._task is not None:
            await self.flush(timeout)
        cut_short = [row_id for h in self.hooks for row_id in h.inflight]
        tasks = [t for t in (self._task, *self._sends) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        try:
            await self._io(self.outbox.release, cut_short)
            counts = await self._io(self.outbox.pending)
        except Exception as exc:  # noqa: BLE001 - the store is gone: leases expire by themselves
            _say(log.warning, {"event": "webhook_outbox_unavailable", "reason": _first_line(exc)})
            return -1
        left = {h.name: counts.get(h.key, 0) for h in self.hooks if counts.get(h.key)}
        total = sum(left.values())
        if total:
            fate = ("kept in the outbox: sent by the next follow with this store and webhook"
                    if self.outbox.durable else "dropped: no store to keep them")
            _say(log.warning, {"event": "webhook_pending_at_exit", "pending": total, "webhooks": left,
                                    "detail": f"{total} deliveries still pending, {fate}"})
        return total

    # -- the worker --------------------------------------------------------------------------
    async def _io(self, fn, *args):
        """Store calls run in a thread; the memory outbox is called directly."""
        return await asyncio.to_thread(fn, *args) if self.outbox.durable else fn(*args)

    async def _run(self, report_backlog: bool) -> None:
        if report_backlog and self.outbox.durable:
            await self._report_backlog()
        while True:
            self._wake.clear()
            try:
                await self._dispatch()
                await self._update_gauge()
                self._store_ok()
            except Exception as exc:  # noqa: BLE001 - the store is unreachable: retried at the next poll
                self._store_failed(exc)
            await self._sleep()

    async def _report_backlog(self) -> None:
        try:
            counts = await self._io(self.outbox.pending)
        except Exception as exc:  # noqa: BLE001
            self._store_failed(exc)
            return
        keys = {h.key for h in self.hooks}
        ours = sum(n for k, n in counts.items() if k in keys)
        others = sum(n for k, n in counts.items() if k not in keys)
        if ours:
            _say(log.warning, {"event": "webhook_backlog", "pending": ours,
                                    "detail": f"{ours} deliveries left pending by an earlier run: sending"})
        if others:
            _say(log.warning, {"event": "webhook_backlog_elsewhere", "pending": others,
                                    "detail": f"{others} deliveries pending for webhooks not configured now: kept"})

    def _free_slots(self, hook: Hook, now: float) -> int:
        if hook.failing_since is not None:  # one probe at a time, after the backoff
            return 1 if not hook.inflight and now >= hook.retry_at else 0
        return self.per_webhook - len(hook.inflight)

    async def _dispatch(self) -> None:
        for hook in self.hooks:
            free = self._free_slots(hook, time.monotonic())
            if free <= 0:
                continue
            now_ns = time.time_ns()
            batch = await self._io(self.outbox.claim, hook.key, free, now_ns, now_ns + self.lease_ns)
            if not batch and hook.failing_since is not None:
                hook.retry_at = time.monotonic() + self._delay(hook)  # nothing to probe with yet
            for delivery in batch:
                hook.inflight.add(delivery.id)
                task = asyncio.create_task(self._send(hook, delivery))
                self._sends.add(task)
                task.add_done_callback(self._sends.discard)

    async def _sleep(self) -> None:
        wait = self.poll
        now = time.monotonic()
        for hook in self.hooks:
            if hook.failing_since is not None and not hook.inflight:
                wait = min(wait, hook.retry_at - now)
        if wait <= 0:
            return
        try:
            # not wait_for: on 3.11 a wake set as close() cancels this task swallowed the
            # cancel, and close() waited on a worker that never stopped (CI, 2026-12-06)
            async with asyncio.timeout(wait):
                await self._wake.wait()
        except TimeoutError:
            pass

    async def _update_gauge(self) -> None:
        if self.metrics is None or time.monotonic() - self._last_gauge < self.poll:
            return
        self._last_gauge = time.monotonic()
        counts = await self._io(self.outbox.pending)
        for hook in self.hooks:
            self.metrics.outbox_pending(hook.name, counts.get(hook.key, 0))

    def _delay(self, hook: Hook) -> float:
        return min(self.backoff * 2 ** min(max(hook.failures - 1, 0), 30), self.max_backoff)

    async def _send(self, hook: Hook, delivery: Delivery) -> None:
        try:
            outcome, why = await self._post(hook, delivery)
            self._account(hook, delivery, outcome, why)
            state = {OK: DELIVERED, REJECT: REJECTED}.get(outcome, PENDING)
            # Not marked (the store failed): the lease expires and the row is sent again.
            await self._io(self.outbox.done, delivery.id, state, time.time_ns(), why or None)
            self._store_ok()
        except Exception as exc:  # noqa: BLE001
            self._store_failed(exc)
        finally:
            hook.inflight.discard(delivery.id)
            self._wake.set()

    async def _post(self, hook: Hook, delivery: Delivery) -> tuple[str, str]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        try:
            async with self._session.post(hook.url, data=delivery.payload.encode(), allow_redirects=False,
                                          headers={"Content-Type": "application/json"}) as resp:
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return RETRY, _reason(exc)
        if 200 <= status < 300:
            return OK, ""
        if status >= 500 or status in (408, 429):
            return RETRY, f"http_{status}"
        return REJECT, f"http_{status}"

    def _account(self, hook: Hook, delivery: Delivery, outcome: str, why: str) -> None:
        """Counters, and a log line when a webhook starts failing, recovers or refuses a finding."""
        if self.metrics is not None:
            self.metrics.delivery(hook.name, outcome == OK, why)
        if outcome == OK:
            hook.sent += 1
        elif outcome == REJECT:
            hook.rejected += 1
            _say(log.error, {"event": "webhook_rejected", "webhook": hook.name, "id": delivery.finding_id,
                                  "reason": why, "detail": "the receiver refused this finding: not retried"})
        if outcome != RETRY:  # it answered: reachable again
            if hook.failing_since is not None:
                _say(log.warning, {"event": "webhook_recovered", "webhook": hook.name,
                                        "failing_for_s": round(time.monotonic() - hook.failing_since, 1),
                                        "failed_attempts": hook.failures})
            hook.failures, hook.failing_since = 0, None
            return
        hook.failures += 1
        hook.retry_at = time.monotonic() + self._delay(hook)
        if hook.failing_since is None:
            hook.failing_since = time.monotonic()
            _say(log.warning, {"event": "webhook_failing", "webhook": hook.name, "reason": why,
                                    "detail": "deliveries are kept and retried with backoff"})
        else:
            _say(log.debug, {"event": "webhook_retry", "webhook": hook.name, "id": delivery.finding_id,
                                  "attempt": hook.failures, "reason": why})

    def _store_failed(self, exc: Exception) -> None:
        reason = _first_line(exc)
        if self._store_error is None:
            _say(log.warning, {"event": "webhook_outbox_unavailable", "reason": reason,
                                    "detail": "deliveries wait until the store answers again"})
        self._store_error = reason

    def _store_ok(self) -> None:
        if self._store_error is not None:
            _say(log.warning, {"event": "webhook_outbox_available"})
            self._store_error = None


def _say(log_at, event: dict) -> None:
    """One log line per webhook event: its words as the message, its fields as the record's
    (top-level keys with --log-format json, as findings are)."""
    fields = dict(event)  # `detail` too: the same field a finding's line has
    text = event.get("detail") or event["event"].replace("_", " ")
    where = f" ({event['webhook']})" if event.get("webhook") else ""
    why = f": {event['reason']}" if event.get("reason") and event.get("reason") not in text else ""
    log_at("%s%s%s", text, where, why, extra=fields)


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]
