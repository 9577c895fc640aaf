"""The Prometheus exposition of `follow` and `serve`: one naming scheme, a run's counters at 0
from its start, no `_created` series, bounded labels for `serve`, readiness and liveness; the
real `promtool check metrics` on what a running `follow` (real kubectl, simulated cluster) and
a running `serve` answer."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families
from store_fixtures import ingest_sample
from test_prometheus_rules import run_promtool

from steptail.collector.cluster.kubectl import KubeTarget
from steptail.collector.live.follower import FollowConfig, RunStatus
from steptail.collector.live.supervisor import Plan
from steptail.collector.live.wiring import follow
from steptail.collector.notify.metrics import (
    COMPLETED_STATE,
    DISCOVERY_ERRORS,
    Metrics,
    MetricsServer,
)
from steptail.http.metrics import StoreCollector
from steptail.http.server import serve
from steptail.runs.findings import KINDS, Finding
from steptail.storage.db import open_store

pytestmark = pytest.mark.timeout(120)


def samples_of(text: str) -> dict:
    """(name, sorted labels) -> value of every sample."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def run_series(samples: dict, run: str) -> dict:
    return {k: v for k, v in samples.items() if ("run", run) in k[1]}


def check_metrics(text: str) -> None:
    """promtool's lint: exit 0 and nothing to say."""
    proc = run_promtool("check", "metrics", stdin=text.encode())
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout.decode() + proc.stderr.decode()


def test_promtool_check_metrics_can_fail():
    proc = run_promtool("check", "metrics", stdin=b"# HELP steptail_x a counter\n# TYPE steptail_x counter\n"
                        b"steptail_x 1\n")
    assert proc.returncode != 0 and b"_total" in proc.stdout + proc.stderr


def test_a_runs_counters_exist_at_zero_from_its_start():
    metrics = Metrics()
    status = RunStatus("r", "j")
    metrics.run_started("r", status)
    text = metrics.render().decode()
    assert "_created" not in text
    check_metrics(text)
    got = samples_of(text)
    for kind in KINDS:  # every finding kind the engine raises: increase() sees the first one
        assert got[("steptail_findings_total", (("kind", kind), ("run", "r")))] == 0
    assert got[("steptail_missing_steps_total", (("run", "r"),))] == 0
    assert got[("steptail_bad_lines_total", (("run", "r"),))] == 0
    for reason in ("eof", "silence"):
        assert got[("steptail_stream_reconnects_total", (("reason", reason), ("run", "r")))] == 0
    for source, reason in (("follower", "auth"), ("follower", "network"), ("store", "store")):
        assert got[("steptail_errors_total", (("reason", reason), ("run", "r"), ("source", source)))] == 0
    for reason in DISCOVERY_ERRORS:  # discovery's from start-up, before any run
        assert got[("steptail_errors_total", (("reason", reason), ("run", ""), ("source", "discovery")))] == 0
    assert got[("steptail_run_done", (("run", "r"),))] == 0
    assert ("steptail_last_step", (("run", "r"),)) not in got  # no step recorded yet: no made-up value

    metrics.finding(Finding("gap", "r", 1, 60, 63, "steps 60-63 missing", "warning", 1))
    metrics.step("r", 64, 1_700_000_000_500_000_000)
    metrics.owned(3)
    got = samples_of(metrics.render().decode())
    assert got[("steptail_findings_total", (("kind", "gap"), ("run", "r")))] == 1
    assert got[("steptail_missing_steps_total", (("run", "r"),))] == 4
    assert got[("steptail_last_step", (("run", "r"),))] == 64
    assert got[("steptail_last_step_timestamp_seconds", (("run", "r"),))] == pytest.approx(1_700_000_000.5)
    assert got[("steptail_runs_owned", ())] == 3

    metrics.run_started("r", status)  # again (a run taken back): the counts stay
    assert samples_of(metrics.render().decode())[("steptail_missing_steps_total", (("run", "r"),))] == 4
    status.state = COMPLETED_STATE  # process 0 completed, its log read to the end
    assert samples_of(metrics.render().decode())[("steptail_run_done", (("run", "r"),))] == 1


def test_a_run_handed_over_leaves_no_series():
    metrics = Metrics()
    for run in ("mine", "theirs"):
        metrics.run_started(run, RunStatus(run, run))
        metrics.step(run, 5)
        metrics.reconnect(run, "eof")
        metrics.error(run, "follower", "other")
        metrics.up(run, "follower", True)
    assert samples_of(metrics.render().decode())[("steptail_runs_owned", ())] == 2
    metrics.run_stopped("theirs")
    got = samples_of(metrics.render().decode())
    assert run_series(got, "mine") and not run_series(got, "theirs")
    assert got[("steptail_runs_owned", ())] == 1


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as resp:
        return resp.status, await resp.text()


async def test_healthz_is_ready_only_when_told_and_livez_always():
    ready = [False]
    server = MetricsServer(Metrics(), port=0, ready=lambda: ready[0])
    port = await server.start()
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as s:
            assert (await _get(s, f"{base}/healthz"))[0] == 503
            assert await _get(s, f"{base}/livez") == (200, "ok\n")
            ready[0] = True
            assert await _get(s, f"{base}/healthz") == (200, "ok\n")
            assert (await _get(s, f"{base}/livez"))[0] == 200
    finally:
        await server.stop()


async def test_follow_is_ready_once_pods_are_listed(make_simcluster, tmp_path, monkeypatch):
    """Pod lists refused (RBAC not applied yet): not ready, alive; allowed: ready."""
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")
    sim = make_simcluster({"rate": 20, "jobsets": [{"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": 100}}]})
    sim.deny()
    store = open_store(str(tmp_path / "r.db"))
    plan = Plan(KubeTarget("default", sim.account, str(sim.kubeconfig_path)), {"olmo3-sft": "r"},
                config=FollowConfig(), give_up=600)
    seen: dict[str, list] = {"denied": [], "allowed": []}
    tasks = []

    def on_start(sup, metrics_url):
        base = metrics_url.removesuffix("/metrics")

        async def probe():
            async with aiohttp.ClientSession() as s:
                seen["denied"].append((await _get(s, f"{base}/healthz"))[0])
                while sup.discovery.health.failing is None:  # until the API refused a list
                    await asyncio.sleep(0.05)
                seen["denied"].append((await _get(s, f"{base}/healthz"))[0])
                seen["denied"].append((await _get(s, f"{base}/livez"))[0])
                seen["metrics"] = (await _get(s, metrics_url))[1]
                sim.deny(0)  # the Role applied
                while (status := (await _get(s, f"{base}/healthz"))[0]) != 200:
                    await asyncio.sleep(0.05)
                seen["allowed"] = [status, (await _get(s, f"{base}/livez"))[0]]
            sup.stop()

        tasks.append(asyncio.get_running_loop().create_task(probe()))

    try:
        await asyncio.wait_for(follow(store, plan, metrics_port=0, on_start=on_start), 90)
        await asyncio.wait_for(tasks[0], 10)
    finally:
        store.dispose()
    assert seen["denied"] == [503, 503, 200]  # /healthz, /healthz once refused, /livez
    assert seen["allowed"] == [200, 200]
    got = samples_of(seen["metrics"])
    assert got[("steptail_discovery_up", ())] == 0
    refused = ("steptail_errors_total", (("reason", "forbidden"), ("run", ""), ("source", "discovery")))
    assert got[refused] >= 1


async def test_follow_exposition_passes_promtool_and_counts_from_zero(make_simcluster, tmp_path, monkeypatch):
    """A live `follow`: the run's finding counter is scraped at 0 before its first finding
    (a NaN CE at step 100) and at 1 after; promtool finds nothing to lint; no _created series."""
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")
    sim = make_simcluster({"rate": 10, "jobsets": [{"name": "olmo3-sft", "hosts": 2,
                                                    "trainer": {"steps": 130, "nan_steps": [100]}}]})
    store = open_store(str(tmp_path / "f.db"))
    plan = Plan(KubeTarget("default", sim.account, str(sim.kubeconfig_path)), {"olmo3-sft": "r"},
                config=FollowConfig())  # not --until-done: a completed run stays, done by its state
    scraped: list[str] = []
    tasks = []
    nan = ("steptail_findings_total", (("kind", "nonfinite_ce"), ("run", "r")))
    done = ("steptail_run_done", (("run", "r"),))

    def on_start(sup, metrics_url):
        async def scrape():
            async with aiohttp.ClientSession() as s:
                while True:
                    text = (await _get(s, metrics_url))[1]
                    got = samples_of(text)
                    if nan in got:
                        scraped.append(text)
                    if got.get(done) == 1:
                        break
                    await asyncio.sleep(0.1)
            sup.stop()

        tasks.append(asyncio.get_running_loop().create_task(scrape()))

    try:
        sup = await asyncio.wait_for(follow(store, plan, metrics_port=0, on_start=on_start), 90)
        await asyncio.wait_for(tasks[0], 10)
    finally:
        store.dispose()
    assert sup.status["r"].last_step == 130
    first, last = samples_of(scraped[0]), samples_of(scraped[-1])
    assert first[nan] == 0, "the finding counter must exist at 0 before the first finding"
    assert last[nan] == 1 and last[done] == 1
    assert last[("steptail_last_step", (("run", "r"),))] == 130
    stamp = last[("steptail_last_step_timestamp_seconds", (("run", "r"),))]
    assert time.time() - 600 < stamp <= time.time()  # the step's kubelet time, unix seconds
    assert last[("steptail_follower_up", (("run", "r"),))] == 1
    assert not any("_created" in text for text in scraped)
    check_metrics(scraped[-1])


@pytest.fixture
def loaded(store, samples):
    for run in ("recent", "old"):
        ingest_sample(store, samples, run, "resume-gap")
    with store.engine.begin() as conn:  # a run nobody touched for 30 days
        conn.execute(sa.text("UPDATE runs SET updated_ns = :t WHERE run = 'old'"),
                     {"t": time.time_ns() - 30 * 86400 * 10**9})
    return store


async def test_serve_exposition_passes_promtool_with_the_same_names(loaded):
    urls: list[str] = []
    stop = asyncio.Event()
    task = asyncio.create_task(serve(loaded, "127.0.0.1", 0, None, started=urls.append, stop=stop))
    try:
        while not urls and not task.done():
            await asyncio.sleep(0.01)
        async with aiohttp.ClientSession() as s:
            status, text = await _get(s, f"{urls[0]}/metrics")
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert status == 200
    check_metrics(text)
    got = samples_of(text)
    assert got[("steptail_runs", ())] == 2
    assert got[("steptail_recent_runs", ())] == 1  # the old run is counted, not labelled
    assert not run_series(got, "old")
    with loaded.engine.connect() as conn:
        last_ns = conn.execute(sa.text("SELECT MAX(ts_ns) FROM loss_parts WHERE run = 'recent'")).scalar()
    # follow's names for the same facts
    assert got[("steptail_last_step", (("run", "recent"),))] == 400
    assert got[("steptail_last_step_timestamp_seconds", (("run", "recent"),))] == pytest.approx(last_ns / 1e9)
    follow_names = {line.split()[2] for line in Metrics().render().decode().splitlines() if line.startswith("# TYPE")}
    assert {"steptail_last_step", "steptail_last_step_timestamp_seconds"} <= follow_names


def test_serve_labels_at_most_max_runs(loaded):
    families = {f.name: f for f in StoreCollector(loaded, recent_days=365, max_runs=1).collect()}
    assert families["steptail_runs"].samples[0].value == 2
    assert families["steptail_recent_runs"].samples[0].value == 1
    assert [s.labels["run"] for s in families["steptail_last_step"].samples] == ["recent"]  # the most recent


def test_a_resumed_run_shows_its_last_stored_step(store, samples):
    """A collector that restarts or takes a run over: the step gauges hold the store's last
    step and its time before anything new is read (a stalled run is seen as stalled)."""
    from steptail.collector.live.detect import Detectors

    ingest_sample(store, samples, "rg", "resume-gap")
    ingest_sample(store, samples, "untimed", "cp4-lb-nan")  # logged without kubelet timestamps
    with store.engine.connect() as conn:
        step, ts_ns = conn.execute(sa.text("SELECT step, ts_ns FROM loss_parts WHERE run = 'rg'"
                                           " ORDER BY incarnation DESC, step DESC LIMIT 1")).first()
    metrics = Metrics()
    for run in ("rg", "untimed", "unknown"):
        metrics.run_started(run)
        Detectors(run, store, None, metrics)
    got = samples_of(metrics.render().decode())
    assert got[("steptail_last_step", (("run", "rg"),))] == step == 400
    assert got[("steptail_last_step_timestamp_seconds", (("run", "rg"),))] == pytest.approx(ts_ns / 1e9)
    for run in ("untimed", "unknown"):  # no honest time to show: no gauge
        assert ("steptail_last_step_timestamp_seconds", (("run", run),)) not in got
