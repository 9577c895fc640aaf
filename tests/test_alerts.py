"""Live alerts over real sockets: webhooks to a local aiohttp receiver (one that fails twice
then accepts, one that rejects), Prometheus metrics scraped over HTTP and parsed with
prometheus_client's parser, and the structured log line."""

from __future__ import annotations

import logging

import aiohttp
import pytest
from aiohttp import web
from findings_logs import feed_engine, keys, sample_lines
from prometheus_client.parser import text_string_to_metric_families

from steptail.collector.live.detect import Detectors
from steptail.collector.live.sink import RunSink
from steptail.collector.notify.alerts import Alerter
from steptail.collector.notify.metrics import Metrics, MetricsServer
from steptail.runs.findings import Finding
from steptail.storage.findings import load_findings
from steptail.storage.sql import load_model

pytestmark = pytest.mark.timeout(60)


class Receiver:
    """A webhook endpoint: /ok accepts, /flaky answers 500 twice then accepts, /reject 400."""

    def __init__(self) -> None:
        self.got: dict[str, list[dict]] = {"ok": [], "flaky": [], "reject": []}
        self.flaky_failures = 2

    async def handle(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = await request.json()
        self.got[name].append(body)
        if name == "reject":
            return web.Response(status=400)
        if name == "flaky" and self.flaky_failures:
            self.flaky_failures -= 1
            return web.Response(status=500)
        return web.json_response({"ok": True})


@pytest.fixture
async def receiver():
    rec = Receiver()
    app = web.Application()
    app.router.add_post("/hook/{name}", rec.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    rec.url = lambda name: f"http://127.0.0.1:{port}/hook/{name}?token=s3cret"
    yield rec
    await runner.cleanup()


def logged_event(record) -> dict:
    """A finding's or webhook event's log record carries its fields (steptail.logs prints them)."""
    from steptail.logs import fields

    return fields(record)


def finding(kind="gap", first=60, last=63, run="r1") -> Finding:
    return Finding(kind, run, 1, first, last, f"{kind} at {first}", "warning", 1_796_011_200_000_000_000)


async def test_webhooks_each_finding_once_with_retries(receiver, caplog):
    caplog.set_level(logging.INFO, logger="steptail.alerts")
    alerter = Alerter([receiver.url("ok"), receiver.url("flaky"), receiver.url("reject")], backoff=0.01)
    f = finding()
    assert await alerter.publish([f]) == [f]
    grown = finding(last=64)  # same key, grown: not sent again
    assert await alerter.publish([grown, f]) == []
    assert await alerter.flush(timeout=20)
    assert [p["id"] for p in receiver.got["ok"]] == ["r1/gap/1/60"]
    assert receiver.got["ok"][0]["first_step"] == 60 and receiver.got["ok"][0]["last_step"] == 63
    assert receiver.got["ok"][0]["detected_at"] == "2026-11-30T04:00:00Z"
    assert len(receiver.got["flaky"]) == 3  # 500, 500, accepted
    assert len(receiver.got["reject"]) == 1  # a 4xx is final
    assert alerter.sent == {receiver.url("ok"): 1, receiver.url("flaky"): 1, receiver.url("reject"): 0}
    assert alerter.failed[receiver.url("reject")] == 1
    await alerter.close()
    events = [logged_event(r) for r in caplog.records]
    assert [e["event"] for e in events if e["event"] == "finding"] == ["finding"]
    found = next(e for e in events if e["event"] == "finding")
    assert found["kind"] == "gap" and found["run"] == "r1" and found["first_step"] == 60
    # the flaky webhook: one line when it starts failing, one when it recovers, none per retry
    assert sorted(e["event"] for e in events if e["event"].startswith("webhook_")) == [
        "webhook_failing", "webhook_recovered", "webhook_rejected"]
    assert all("s3cret" not in r.getMessage() for r in caplog.records)  # secrets stay out of logs


async def test_an_info_finding_is_logged_at_info_and_never_sent(receiver, caplog):
    """Info is noted with nothing to do (docs/verdicts.md): logged at INFO, stored, no webhook."""
    caplog.set_level(logging.INFO, logger="steptail.alerts")
    alerter = Alerter([receiver.url("ok")], backoff=0.01)
    info = Finding("rule:queue", "r1", 0, -1, -1, "not evaluable: no Workload", "info", 1_796_011_200_000_000_000)
    gap = finding()
    assert await alerter.publish([info]) == [info]
    assert await alerter.publish([gap]) == [gap]
    assert await alerter.flush(timeout=20)
    assert [p["id"] for p in receiver.got["ok"]] == ["r1/gap/1/60"]  # the info one never went out
    levels = {logged_event(r)["kind"]: r.levelno for r in caplog.records if logged_event(r).get("event") == "finding"}
    assert levels == {"rule:queue": logging.INFO, "gap": logging.WARNING}
    await alerter.close()


async def test_an_unreachable_receiver_keeps_the_delivery_pending(caplog):
    """Retried, never given up: at exit one line says what is still pending."""
    alerter = Alerter(["http://127.0.0.1:9/hook"], backoff=0.01, max_backoff=0.05)
    await alerter.publish([finding()])
    assert not await alerter.flush(timeout=1)
    assert alerter.failed["http://127.0.0.1:9/hook"] == 0 and alerter.sent["http://127.0.0.1:9/hook"] == 0
    assert await alerter.close(timeout=0.1) == 1
    (line,) = [logged_event(r) | {"detail": r.getMessage()} for r in caplog.records
               if getattr(r, "event", None) == "webhook_pending_at_exit"]
    assert line["pending"] == 1 and "1 deliveries still pending" in line["detail"]


async def scrape(server: MetricsServer) -> dict:
    async with aiohttp.ClientSession() as s, s.get(server.url) as resp:
        assert resp.status == 200
        text = await resp.text()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def test_metrics_over_http_from_a_live_sample(samples, receiver):
    metrics = Metrics()
    server = MetricsServer(metrics, port=0)
    port = await server.start()
    assert port > 0 and server.host == "127.0.0.1"
    alerter = Alerter([receiver.url("ok")], metrics=metrics, backoff=0.01)
    try:
        _, outputs = feed_engine("rg", sample_lines(samples / "resume-gap.log"), every=5)
        for out in outputs:
            await alerter.publish(out)
        metrics.step("rg", 400, at_ns=0)
        metrics.reconnect("rg", "eof")
        metrics.reconnect("rg", "eof")
        metrics.reconnect("rg", "silent")
        metrics.bad_lines("rg", 3)
        got = await scrape(server)
        assert got[("steptail_last_step", (("run", "rg"),))] == 400
        assert got[("steptail_last_step_timestamp_seconds", (("run", "rg"),))] == 0  # the step's own time
        assert got[("steptail_missing_steps_total", (("run", "rg"),))] == 4
        assert got[("steptail_findings_total", (("kind", "gap"), ("run", "rg")))] == 1
        assert got[("steptail_findings_total", (("kind", "missing_rbf"), ("run", "rg")))] == 1
        assert got[("steptail_stream_reconnects_total", (("reason", "eof"), ("run", "rg")))] == 2
        assert got[("steptail_stream_reconnects_total", (("reason", "silent"), ("run", "rg")))] == 1
        assert got[("steptail_bad_lines_total", (("run", "rg"),))] == 3
        assert await alerter.flush(timeout=20)
        assert sorted(p["kind"] for p in receiver.got["ok"]) == ["gap", "missing_rbf"]
    finally:
        await alerter.close()
        await server.stop()


async def test_grown_range_alerted_once(samples, receiver):
    alerter = Alerter([receiver.url("ok")], backoff=0.01)
    _, outputs = feed_engine("rm", sample_lines(samples / "resume-mismatch.log"), every=1)
    assert sum(len(o) for o in outputs) == 20  # opened at 101, grown 19 times
    for out in outputs:
        await alerter.publish(out)
    assert await alerter.flush(timeout=20)
    await alerter.close()
    (p,) = receiver.got["ok"]
    assert (p["kind"], p["first_step"], p["last_step"]) == ("resume_mismatch", 101, 101)
    assert p["severity"] == "critical" and "[critical] rm: resume_mismatch" in p["text"]

async def follow_lines(store, lines, alerter=None, metrics=None, finish=False) -> None:
    """What `follow` runs for one run: its sink commits each batch and hands it to the run's
    detectors (resumed from the store), 50 lines at a time."""
    sink = RunSink(store, "rg", None, Detectors("rg", store, alerter, metrics))
    with store.engine.connect() as conn:
        model = load_model(conn, "rg")
    for i in range(0, len(lines), 50):
        for line in lines[i:i + 50]:
            model.feed(line)
        await sink.flush(model)
    if finish:
        sink.detectors.finish()  # the run ended: the end-of-data checks
        await sink.flush(model)


@pytest.mark.parametrize("split_at,published", [(b"LOSS-PARTS step=50 ", {"gap", "missing_rbf"}),
                                                (b"LOSS-PARTS step=100 ", set())])
async def test_live_findings_resume_from_the_store(store, samples, receiver, split_at, published):
    """`follow` restarting mid-run: history comes from the store, only new findings alert."""
    lines = sample_lines(samples / "resume-gap.log")
    cut = next(i for i, line in enumerate(lines) if split_at in line)
    await follow_lines(store, lines[:cut])  # the first collector, killed at the cut
    metrics = Metrics()
    alerter = Alerter([receiver.url("ok")], metrics=metrics, backoff=0.01)
    await follow_lines(store, lines[cut:], alerter, metrics, finish=True)
    assert await alerter.flush(timeout=20)
    await alerter.close()
    assert {p["kind"] for p in receiver.got["ok"]} == published
    with store.engine.connect() as conn:
        assert keys(load_findings(conn, "rg")) == {("gap", 1, 60, 63), ("missing_rbf", 1, 90, 91)}
    assert metrics.registry.get_sample_value("steptail_last_step", {"run": "rg"}) == 400
