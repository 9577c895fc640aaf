"""Every failure is heard, headless or not (issue 9): `follow` run the way a Deployment runs
it (stdout not a terminal) against the simulated cluster and the real kubectl. A pod list
refused (403), pods the client cannot deserialize, an unreachable API server, a bad
kubeconfig or context: each is one line when it starts and one when it clears (or one
error line and exit 2 when it is a configuration error), counted in the summary and in
Prometheus, never a traceback or urllib3's retry warnings."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from test_follow_support import assert_exactly_once, collector_events, findings, recorded, scenario

from steptail.collector.cluster.kubectl import KubeTarget
from steptail.collector.live.follower import FollowConfig
from steptail.collector.live.supervisor import Plan
from steptail.collector.live.wiring import follow
from steptail.storage.db import open_store

pytestmark = pytest.mark.timeout(120)
CLI = [sys.executable, "-c", "from steptail.cli import main; main()"]
SLOW = {"rate": 20, "jobsets": [{"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": 160, "checkpoint_period": 50}}]}


def _follow(sim, db: str, *extra: str, kubeconfig: str | None = None, timeout: float = 90, meanwhile=None):
    """`follow` headless to its end: (CompletedProcess, seconds); `meanwhile(proc)` runs while it does."""
    args = [*CLI, "follow", "--jobset", "olmo3-sft", "--run", "r", "-n", "default", "--db", db, "--no-view",
            "--kubeconfig", kubeconfig or str(sim.kubeconfig_path), *extra]
    started = time.monotonic()
    proc = subprocess.Popen(args, env=sim.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if meanwhile is not None:
            meanwhile(proc)
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"follow did not end within {timeout} s:\n{err}\n{out}") from None
    return subprocess.CompletedProcess(args, proc.returncode, out, err), time.monotonic() - started


def _quiet_libraries(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert "Retrying" not in stderr, stderr


def _error_line(proc) -> str:
    """The one `steptail: error:` line of a configuration error (exit 2)."""
    assert proc.returncode == 2, proc.stderr
    _quiet_libraries(proc.stderr)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("steptail: error: ")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def _json_lines(stderr: str) -> list[dict]:
    lines = [json.loads(ln) for ln in stderr.splitlines() if ln.strip()]
    assert all(rec["severity"] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL") for rec in lines)
    return lines


def _state_changes(records: list[dict], source: str) -> list[tuple[str, str]]:
    return [(r["state"], r["kind"]) for r in records if r.get("source") == source]


def _rows(db: str) -> int:
    try:
        return len(recorded(db, "r"))
    except Exception:  # noqa: BLE001 - the schema is not there yet
        return 0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- configuration errors: one line, exit 2 ----------------------------------------------------

def test_pod_list_denied_from_start_up_exits_2_naming_the_denial(make_simcluster, tmp_path):
    sim = make_simcluster(scenario())
    sim.deny()  # forever: the RBAC Role was never applied
    proc, took = _follow(sim, str(tmp_path / "d.db"), "--give-up", "3")
    line = _error_line(proc)
    assert took < 60
    assert line.startswith('steptail: error: cannot list pods in namespace "default": pods is forbidden: '
                           'User "system:serviceaccount:default:steptail" cannot list resource "pods"'), line
    assert "(403)" in line and "deploy/rbac.yaml" in line
    # besides the error: only the one state-change line of discovery
    others = [ln for ln in proc.stderr.splitlines() if not ln.startswith("steptail: error: ")]
    assert len(others) == 1 and "discovery failing (forbidden)" in others[0], proc.stderr


def test_give_up_defaults_to_30_seconds():
    from steptail.commands.follow import command

    option = next(p for p in command.params if p.name == "give_up")
    assert option.default == 30.0 and Plan(KubeTarget("default", "a@b")).give_up == 30.0
    proc = subprocess.run([*CLI, "follow", "--help"], capture_output=True, text=True, timeout=60)
    assert "--give-up" in proc.stdout and "30.0" in proc.stdout and "--log-format" in proc.stdout


def test_unreachable_api_server_exits_2(make_simcluster, tmp_path):
    sim = make_simcluster(scenario())
    cfg = yaml.safe_load(sim.kubeconfig_path.read_text())
    port = _closed_port()
    cfg["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    kc = tmp_path / "closed.kubeconfig"
    kc.write_text(yaml.safe_dump(cfg))
    proc, took = _follow(sim, str(tmp_path / "u.db"), "--give-up", "3", kubeconfig=str(kc))
    line = _error_line(proc)
    assert took < 60
    assert f"cannot reach the Kubernetes API at https://127.0.0.1:{port}" in line and "refused" in line, line
    assert len(proc.stderr.strip().splitlines()) <= 2, proc.stderr  # the state change, the error


@pytest.mark.parametrize("case", ["not yaml", "missing file", "no such context"])
def test_bad_kubeconfig_or_context_is_one_line(case, make_simcluster, tmp_path):
    sim = make_simcluster(scenario())
    kc, extra = str(sim.kubeconfig_path), []
    if case == "not yaml":
        kc = str(tmp_path / "bad.kubeconfig")
        (tmp_path / "bad.kubeconfig").write_text("apiVersion: v1\nclusters: [\n")
    elif case == "missing file":
        kc = str(tmp_path / "missing.kubeconfig")
    else:
        extra = ["--context", "no-such-context"]
    proc, _ = _follow(sim, str(tmp_path / "k.db"), *extra, kubeconfig=kc, timeout=60)
    line = _error_line(proc)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert {"not yaml": "not valid YAML", "missing file": "no kubeconfig at",
            "no such context": 'context "no-such-context" is not in kubeconfig'}[case] in line, line
    assert not (tmp_path / "k.db").exists()  # checked before anything started


def test_bad_scenario_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("jobsets: [\n  - {name: a\n")
    proc = subprocess.run([*CLI, "simcluster", "--scenario", str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"steptail: error: bad scenario {bad}"), lines


# ---- failures that clear: one line each way, the run followed to the end --------------------

def test_denial_for_the_first_seconds_is_logged_once_each_way_and_nothing_is_lost(make_simcluster, tmp_path):
    sim = make_simcluster({**scenario(), **SLOW})
    db = str(tmp_path / "t.db")
    sim.deny(10)  # from now, not from follow's start: a loaded machine takes seconds to start it
    proc, _ = _follow(sim, db, "--until-done", "--json", "--log-format", "json")
    assert proc.returncode == 0, proc.stderr
    _quiet_libraries(proc.stderr)
    records = _json_lines(proc.stderr)  # every stderr line is one JSON object
    assert _state_changes(records, "discovery") == [("failing", "forbidden"), ("ok", "forbidden")], records
    failing = next(r for r in records if r.get("source") == "discovery")
    assert failing["severity"] == "WARNING" and 'cannot list resource "pods"' in failing["reason"]
    assert len(assert_exactly_once(sim, db, "r")["got"]) == 160
    report = json.loads(proc.stdout)
    assert report["discovery"]["state"] == "ok"
    assert report["discovery"]["errors"]["forbidden"] == report["discovery"]["failures"] >= 1
    assert "pods is forbidden" in report["discovery"]["last_error"]
    assert report["runs"][0]["state"] == "done"


def test_denial_after_pods_were_listed_is_alerted_and_retried_not_fatal(make_simcluster, tmp_path):
    # once steps are recorded (pods were listed), pods are denied and the watch ends: the
    # re-watch and re-lists get 403 for longer than --give-up: alerted, retried, followed
    sim = make_simcluster({**scenario(), **SLOW, "jobsets": [{"name": "olmo3-sft", "hosts": 2,
                                                              "trainer": {"steps": 300, "checkpoint_period": 50}}]})
    db = str(tmp_path / "a.db")

    def deny_once_following(proc):
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            if os.path.exists(db) and _rows(db) >= 20:
                sim.deny(3)
                sim.eof_streams()
                return
            time.sleep(0.1)

    proc, _ = _follow(sim, db, "--until-done", "--give-up", "1", meanwhile=deny_once_following)
    assert proc.returncode == 0, proc.stderr
    _quiet_libraries(proc.stderr)
    assert len(assert_exactly_once(sim, db, "r")["got"]) == 300
    # pod discovery's denial is the collector's: one collector event for every run (run None),
    # stored with its start and clear; no finding of the run
    assert not [kind for kind, _ in findings(db, "r") if kind == "auth_failure"]
    denied = [e for e in collector_events(db, "r") if e["run"] is None and e["kind"] == "auth_failure"]
    assert denied and "pods is forbidden" in denied[0]["reason"] and denied[0]["cleared"], denied
    assert "pod discovery: ok, " in proc.stdout and "forbidden ×" in proc.stdout, proc.stdout


async def test_undeserializable_pods_are_logged_counted_and_in_metrics(make_simcluster, tmp_path, caplog):
    # the process-0 container restarts while pods cannot be read: the watch's event fails,
    # re-lists fail until the objects are readable again, then the restart is followed
    sim = make_simcluster({**scenario(), **SLOW, "faults": [{"action": "corrupt_pods", "at_step": 40, "seconds": 3},
                                              {"action": "restart_container", "at_step": 41}]})
    db = str(tmp_path / "c.db")
    store = open_store(db)
    plan = Plan(KubeTarget("default", sim.account, str(sim.kubeconfig_path)), {"olmo3-sft": "r"},
                config=FollowConfig(until_done=True))
    scraped: list[str] = []
    scrapers: list[asyncio.Task] = []

    def on_start(sup, metrics_url):
        async def scrape():
            async with aiohttp.ClientSession() as s:
                while not (sup.status and all(st.done for st in sup.status.values())):
                    try:
                        async with s.get(metrics_url) as resp:
                            scraped.append(await resp.text())
                    except aiohttp.ClientError:  # the server stopped: following ended
                        return
                    await asyncio.sleep(0.1)

        scrapers.append(asyncio.get_running_loop().create_task(scrape()))

    caplog.set_level("INFO", logger="steptail.health")
    try:
        sup = await asyncio.wait_for(follow(store, plan, metrics_port=0, on_start=on_start), 90)
    finally:
        store.dispose()
    await asyncio.wait_for(scrapers[0], 10)
    changes = [(r.state, r.kind) for r in caplog.records if getattr(r, "source", None) == "discovery"]
    assert changes == [("failing", "deserialize"), ("ok", "deserialize")], changes
    reason = next(r.reason for r in caplog.records if getattr(r, "source", None) == "discovery")
    assert "creationTimestamp" in reason and "not-a-timestamp" in reason, reason

    assert sup.discovery.health.counts["deserialize"] >= 1
    from steptail.collector.live.view import summary

    report = summary(sup.status, sup.discovery.health)
    assert report["discovery"]["errors"]["deserialize"] == report["discovery"]["failures"] >= 1
    assert report["runs"][0]["state"] == "done"
    metrics = _samples(scraped[-1])
    errors = metrics[("steptail_errors_total", (("reason", "deserialize"), ("run", ""), ("source", "discovery")))]
    assert errors == report["discovery"]["failures"]
    assert metrics[("steptail_discovery_up", ())] == 1
    assert metrics[("steptail_follower_up", (("run", "r"),))] == 1
    got = assert_exactly_once(sim, db, "r")["got"]
    assert (1, 41) in got and (2, 160) in got


def _samples(text: str) -> dict:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out
