"""The alert outbox on SQLite and the real PostgreSQL, with real HTTP receivers: a webhook that
answers 500 for a while then recovers gets every finding; a hanging one never slows the
commits; what a SIGKILLed collector left pending is sent by the next one; two collectors on
one store send each finding once."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa
from aiohttp import web

from steptail.collector.live.detect import Detectors
from steptail.collector.notify.alerts import Alerter
from steptail.collector.notify.metrics import Metrics
from steptail.collector.notify.webhooks import DeliveryWorker
from steptail.runs.findings import Finding
from steptail.storage.outbox import MemoryOutbox

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parent.parent
SECRET = "s3cret-hook-token"


class Receiver:
    """A webhook endpoint: mode "ok" accepts, "fail" answers 500, "hang" never answers."""

    def __init__(self, mode: str = "ok", delay: float = 0.0) -> None:
        self.mode, self.delay = mode, delay
        self.requests: list[str] = []  # finding ids, every POST
        self.accepted: list[str] = []  # finding ids answered 2xx
        self.open_now = self.most_open = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body["id"])
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            if self.mode == "hang":
                await asyncio.sleep(3600)
            await asyncio.sleep(self.delay)
            if self.mode == "fail":
                return web.Response(status=500)
            self.accepted.append(body["id"])
            return web.json_response({"ok": True})
        finally:
            self.open_now -= 1


@asynccontextmanager
async def receiving(rec: Receiver, port: int = 0):
    app = web.Application()
    app.router.add_post("/hook", rec.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, reuse_address=True)
    await site.start()
    rec.url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook?token={SECRET}"
    try:
        yield rec
    finally:
        await runner.cleanup()


def free_port() -> int:
    """A port nothing listens on (yet): deliveries to it are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def findings(n: int, run: str = "r1", start: int = 10) -> list[Finding]:
    return [Finding("gap", run, 1, start + 10 * i, start + 10 * i + 2, f"steps {start + 10 * i}-", "warning",
                    1_796_011_200_000_000_000 + i) for i in range(n)]


def ids(found: list[Finding]) -> list[str]:
    return [f"{f.run}/{f.kind}/{f.incarnation}/{f.first_step}" for f in found]


async def commit(store, alerter: Alerter, found: list[Finding]) -> float:
    """The follower's path: findings and their deliveries in one transaction, then publish.
    Returns how long the commit and the publish took."""
    det = Detectors(found[0].run, alerts=alerter)
    t0 = time.monotonic()

    def transaction() -> None:
        with store.engine.begin() as conn:
            det.save(conn, found)

    await asyncio.to_thread(transaction)
    await det.committed(found)
    return time.monotonic() - t0


def outbox_states(store) -> dict[str, int]:
    with store.engine.connect() as conn:
        return dict(conn.execute(sa.text("SELECT state, COUNT(*) FROM alert_outbox GROUP BY state")).all())


async def until(cond, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def events(caplog) -> list[dict]:
    """What steptail.alerts logged: each finding's and webhook event's fields are its record's
    (steptail.logs prints them)."""
    from steptail.logs import fields

    return [fields(r) for r in caplog.records if r.name == "steptail.alerts"]


async def test_a_webhook_failing_then_recovering_gets_every_finding(store, caplog):
    caplog.set_level(logging.DEBUG, logger="steptail.alerts")
    found = findings(12)
    metrics = Metrics()
    async with receiving(Receiver("fail")) as flaky, receiving(Receiver()) as healthy:
        alerter = Alerter([flaky.url, healthy.url], metrics, store=store, backoff=0.05, max_backoff=0.2, poll=0.2)
        alerter.start()
        for i in range(0, 12, 4):
            await commit(store, alerter, found[i:i + 4])
        # the healthy webhook is not held up by the failing one
        await until(lambda: len(healthy.accepted) == 12, 20)
        await until(lambda: len(flaky.requests) >= 4, 20)
        # a delivery is marked in the store just after the receiver answered
        await until(lambda: outbox_states(store).get("delivered", 0) == 12, 20)
        assert not flaky.accepted and outbox_states(store)["pending"] == 12
        flaky.mode = "ok"
        assert await alerter.flush(timeout=30)
        assert await alerter.close() == 0
    want = sorted(ids(found))
    assert sorted(flaky.accepted) == want and sorted(healthy.accepted) == want  # each exactly once
    assert set(flaky.requests) == set(want)
    assert outbox_states(store) == {"delivered": 24}
    names = {h.url: h.name for h in alerter.deliveries.hooks}
    assert SECRET not in "".join(names.values())
    sample = metrics.registry.get_sample_value
    assert sample("steptail_webhook_deliveries_total", {"webhook": names[flaky.url]}) == 12
    assert sample("steptail_webhook_failures_total", {"webhook": names[flaky.url], "reason": "http_500"}) >= 4
    seen = events(caplog)
    assert [e["event"] for e in seen if e["event"] in ("webhook_failing", "webhook_recovered")] == [
        "webhook_failing", "webhook_recovered"]
    assert not [e for e in seen if e["event"] == "webhook_pending_at_exit"]
    assert all(SECRET not in r.getMessage() for r in caplog.records)


async def test_a_hanging_webhook_does_not_slow_commits(store, caplog):
    caplog.set_level(logging.INFO, logger="steptail.alerts")
    found = findings(30)
    async with receiving(Receiver("hang")) as hanging:
        alerter = Alerter([hanging.url], store=store, timeout=5.0, per_webhook=4, poll=0.2)
        alerter.start()
        took = [await commit(store, alerter, [f]) for f in found]
        await until(lambda: hanging.open_now >= 4, 10)
        more = [await commit(store, alerter, findings(1, start=5000 + i)) for i in range(10)]
        # a commit that waited on the receiver would take the request timeout (5 s)
        assert max(took + more) < 1.0, max(took + more)
        assert hanging.most_open == 4  # bounded concurrency
        assert outbox_states(store) == {"pending": 40}
        t0 = time.monotonic()
        assert await alerter.close(timeout=0.5) == 40
        assert time.monotonic() - t0 < 3.0
    (line,) = [e for e in events(caplog) if e["event"] == "webhook_pending_at_exit"]
    assert line["pending"] == 40 and "kept in the outbox" in line["detail"]
    with store.engine.connect() as conn:  # the attempts cut short are free for the next collector
        assert conn.execute(sa.text("SELECT COUNT(*) FROM alert_outbox WHERE lease_ns IS NOT NULL")).scalar() == 0


KILLED_COLLECTOR = """
import asyncio, sys
from steptail.collector.notify.alerts import Alerter
from steptail.collector.live.detect import Detectors
from steptail.runs.findings import Finding
from steptail.storage.db import open_store

async def main():
    store = open_store(sys.argv[1])
    alerter = Alerter([sys.argv[2]], store=store, backoff=0.05, max_backoff=0.2, timeout=1.0)
    alerter.start()
    det = Detectors("r1", alerts=alerter)
    found = [Finding("gap", "r1", 1, 10 * i, 10 * i + 1, "lost", "warning", i) for i in range(1, 7)]
    with store.engine.begin() as conn:
        det.save(conn, found)
    await det.committed(found)
    print("recorded", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_deliveries_pending_at_a_sigkill_are_sent_after_a_restart(store, db_url, caplog):
    caplog.set_level(logging.INFO, logger="steptail.alerts")
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook?token={SECRET}"  # the receiver is down for now
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", KILLED_COLLECTOR, db_url, url, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line == b"recorded\n", (await proc.stderr.read()).decode()
        await asyncio.sleep(0.5)  # a few refused attempts
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
    assert outbox_states(store) == {"pending": 6}
    want = [f"r1/gap/1/{10 * i}" for i in range(1, 7)]
    async with receiving(Receiver(), port=port) as rec:
        assert rec.url == url
        alerter = Alerter([url], store=store, poll=0.2, timeout=1.0)
        alerter.start()  # nothing new is published: the backlog alone is sent
        assert await alerter.flush(timeout=30)
        await alerter.close()
    assert sorted(rec.accepted) == sorted(want)
    assert outbox_states(store) == {"delivered": 6}
    (backlog,) = [e for e in events(caplog) if e["event"] == "webhook_backlog"]
    assert backlog["pending"] == 6


async def test_a_finding_is_sent_once_per_webhook_even_when_raised_again(store):
    (f,) = findings(1)
    grown = Finding(f.kind, f.run, f.incarnation, f.first_step, f.last_step + 5, "grown", f.severity, f.detected_ns)
    async with receiving(Receiver()) as rec:
        alerter = Alerter([rec.url], store=store, poll=0.2)
        alerter.start()
        await commit(store, alerter, [f])
        await commit(store, alerter, [grown])
        assert await alerter.flush(timeout=20)
        await alerter.close()
        again = Alerter([rec.url], store=store, poll=0.2)  # a restart that sees it again
        again.start()
        await commit(store, again, [grown])
        assert await again.flush(timeout=20)
        await again.close()
    assert rec.accepted == ids([f])
    assert outbox_states(store) == {"delivered": 1}


async def test_two_collectors_on_one_store_send_each_finding_once(store):
    found = findings(20)
    async with receiving(Receiver(delay=0.02)) as rec:
        first = Alerter([rec.url], store=store, poll=0.05)
        second = Alerter([rec.url], store=store, poll=0.05)  # only polls the shared outbox
        first.start()
        second.start()
        for i in range(0, 20, 5):
            await commit(store, first, found[i:i + 5])
        assert await first.flush(timeout=30) and await second.flush(timeout=30)
        await first.close()
        await second.close()
    assert sorted(rec.accepted) == sorted(ids(found))
    assert sum(first.sent.values()) + sum(second.sent.values()) == 20


async def test_a_worker_cancelled_as_it_is_woken_stops():
    """close() cancels the worker while a send that just ended wakes it: asyncio.wait_for on
    Python 3.11 returned the wake and swallowed the cancel, the worker went on polling and
    close() waited on it forever (CI, 2026-12-06: a 120 s timeout)."""
    worker = DeliveryWorker(MemoryOutbox(), ["http://127.0.0.1:9/hook"], poll=5.0)
    worker.start()
    await asyncio.sleep(0.05)  # asleep until woken or the next poll
    worker.wake()
    worker._task.cancel()
    done, _ = await asyncio.wait([worker._task], timeout=2.0)
    assert done, "the worker swallowed its cancel"
    assert worker._task.cancelled()
