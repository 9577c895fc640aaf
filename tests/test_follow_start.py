"""What `follow` does in its first minute when something is off: a JobSet that never appears is
one line after a few seconds and a non-zero exit at the end; in a pod on its ServiceAccount no
Google account is needed; on SQLite the replicas' ownership gauge is not exported."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import aiohttp
import pytest
from sim_fixtures import make_simcluster  # noqa: F401

from steptail.collector.cluster.kubectl import ACCOUNT_VAR, KubeTarget, resolve_account
from steptail.collector.live.follower import FollowConfig
from steptail.collector.live.supervisor import Plan
from steptail.collector.live.wiring import follow
from steptail.storage.db import open_store

pytestmark = pytest.mark.timeout(120)
CLI = [sys.executable, "-c", "from steptail.cli import main; main()"]


def test_a_jobset_that_never_appears_is_one_line_soon_and_an_error_at_the_end(make_simcluster, tmp_path):  # noqa: F811
    sim = make_simcluster({"rate": 20, "jobsets": [{"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": 2000}}]})
    env = {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"} | {ACCOUNT_VAR: sim.account}
    started = time.monotonic()
    proc = subprocess.Popen([*CLI, "follow", "--jobset", "olmo3-stf", "--jobset", "olmo3-sft", "--kubeconfig",
                             str(sim.kubeconfig_path), "--db", str(tmp_path / "s.db"), "--no-view", "--duration", "16",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    said_at = None
    lines = []
    for line in proc.stderr:  # read as it comes: when was it said?
        lines.append(line)
        if said_at is None and "olmo3-stf not found" in line:
            said_at = time.monotonic() - started
    proc.wait(30)
    ended_at = time.monotonic() - started
    assert said_at is not None and ended_at - said_at > 1.5, (said_at, ended_at, lines)  # said while following
    about = [ln for ln in lines if "olmo3-stf" in ln]
    assert len(about) == 2, about  # once while following, once as the error at the end
    assert about[0].split(" ", 2)[1] == "ERROR" and "no process-0 pod after 10 s" in about[0]
    assert about[1].startswith("steptail: error: JobSet olmo3-stf not found in namespace default")
    assert proc.returncode == 2
    report = json.loads(proc.stdout.read())
    assert report["discovery"]["unseen"] == ["olmo3-stf"]
    assert {r["run"]: r["rows"] > 0 for r in report["runs"]} == {"olmo3-stf": False, "olmo3-sft": True}


def test_in_a_pod_the_service_account_needs_no_google_account(tmp_path, monkeypatch):
    monkeypatch.delenv(ACCOUNT_VAR, raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert resolve_account(None) == ""
    assert ACCOUNT_VAR not in KubeTarget("default", "").env()  # no auth plugin runs: none set
    # the CLI's pre-flight lets it through (what stops it here is the missing token file)
    env = {k: v for k, v in os.environ.items() if k not in ("STEPTAIL_DB", ACCOUNT_VAR)}
    done = subprocess.run([*CLI, "follow", "--jobset", "x", "--db", str(tmp_path / "s.db"), "--no-view",
                           "--duration", "1"], capture_output=True, text=True, env=env, timeout=60)
    assert "no account" not in done.stderr, done.stderr
    # outside a pod the account stays required
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    done = subprocess.run([*CLI, "follow", "--jobset", "x", "--db", str(tmp_path / "s.db"), "--no-view"],
                          capture_output=True, text=True, env={**env, "KUBERNETES_SERVICE_HOST": ""}, timeout=60)
    assert done.returncode == 2 and "no account: pass --account" in done.stderr


async def _scrape_while_following(sim, db: str) -> str:
    store = open_store(db)
    plan = Plan(KubeTarget("default", sim.account, str(sim.kubeconfig_path)), {"olmo3-sft": "r"},
                config=FollowConfig(silence=1.0, until_done=True))
    scraped: list[str] = []

    def on_start(sup, url):
        async def scrape():
            async with aiohttp.ClientSession() as s:
                for _ in range(200):
                    async with s.get(url) as resp:
                        text = await resp.text()
                    if "steptail_last_step{" in text:
                        scraped.append(text)
                        return
                    await asyncio.sleep(0.05)
        asyncio.get_running_loop().create_task(scrape())

    try:
        await asyncio.wait_for(follow(store, plan, metrics_port=0, on_start=on_start), 60)
    finally:
        store.dispose()
    return scraped[0]


def test_the_ownership_gauge_is_absent_on_sqlite(make_simcluster, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv(ACCOUNT_VAR, "placeholder@example.invalid")
    sim = make_simcluster({"rate": 50, "jobsets": [{"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": 60}}]})
    text = asyncio.run(_scrape_while_following(sim, str(tmp_path / "s.db")))
    assert "steptail_discovery_up" in text and "steptail_ownership_up" not in text


def test_a_jobset_the_selector_can_never_follow_is_said_once(make_simcluster, tmp_path):  # noqa: F811
    sim = make_simcluster({"rate": 50, "jobsets": [
        {"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": 150}},
        {"name": "other-shape", "replicated_job": "workers", "hosts": 2, "trainer": {"steps": 150}}]})
    env = {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"} | {ACCOUNT_VAR: sim.account}
    done = subprocess.run([*CLI, "follow", "--all", "--selector", "jobset.sigs.k8s.io/replicatedjob-name=slice",
                           "--kubeconfig", str(sim.kubeconfig_path), "--db", str(tmp_path / "s.db"), "--no-view",
                           "--duration", "8", "--json"], capture_output=True, text=True, env=env, timeout=90)
    assert done.returncode == 0, done.stderr
    said = [ln for ln in done.stderr.splitlines() if "is not followed" in ln]
    assert len(said) == 1 and "JobSet other-shape is not followed: no replicated job of it matches --selector " \
        "jobset.sigs.k8s.io/replicatedjob-name=slice" in said[0], done.stderr
    assert [r["run"] for r in json.loads(done.stdout)["runs"]] == ["olmo3-sft"]
