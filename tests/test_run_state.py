"""A run's state comes from the run (steptail.runs.state), on SQLite and PostgreSQL: saved logs
are `ingested` however recently written; a followed run that completed is `ended`, one whose
JobSet failed `failed`, one quiet past k × its step time `stalled`, one no collector follows
any more `unknown`. `check` prints the Kueue stop command only for a run whose workload is
still admitted. And `follow --until-done` on a JobSet that failed and was deleted ends, with
the run marked failed and its logs said not saved (issue 34 row 7), real kubectl against
the simulated cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import pytest
import sqlalchemy as sa
from sim_fixtures import make_simcluster  # noqa: F401
from store_fixtures import db_url, ingest_sample, samples_dir  # noqa: F401

from steptail.runs.state import (
    COMPLETED,
    ENDED,
    FAILED,
    INGESTED,
    JOBSET_FAILED,
    LIVE,
    STALLED,
    UNKNOWN,
    Facts,
    decide,
)
from steptail.storage.db import open_store
from steptail.storage.run_outcome import heartbeat, record, run_state, states

pytestmark = pytest.mark.timeout(240)
CLI = [sys.executable, "-c", "from steptail.cli import main; main()"]
S = 10**9


def steptail(*args: str, account: str | None = None, timeout: float = 150) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("STEPTAIL_DB", "CLOUDSDK_CORE_ACCOUNT")}
    if account:
        env["CLOUDSDK_CORE_ACCOUNT"] = account
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=timeout)


# -- the rule itself ---------------------------------------------------------------------------
def test_the_rule_from_facts():
    now = 1_000_000 * S
    followed = Facts(from_cluster=True, followed_ns=now - 5 * S, last_step_ns=now - 20 * S, step_seconds=1.0)
    assert decide(Facts(from_cluster=False, last_step_ns=now), now).state == INGESTED
    assert decide(followed, now).state == LIVE  # 20 s quiet: under the 30 s floor
    st = decide(followed, now + 100 * S)
    assert st.state == UNKNOWN and "not followed since" in st.reason  # the heartbeat is 105 s old
    assert decide(Facts(**{**followed.__dict__, "followed_ns": now + 90 * S}), now + 100 * S).state == STALLED
    slow = Facts(**{**followed.__dict__, "step_seconds": 60.0})  # 3 × 60 s per step: 120 s quiet is live
    assert decide(Facts(**{**slow.__dict__, "followed_ns": now + 100 * S}), now + 100 * S).state == LIVE
    done = Facts(**{**followed.__dict__, "outcome": COMPLETED, "outcome_ns": now - 10 * S})
    assert decide(done, now + 10**6 * S).state == ENDED  # ended stays ended, followed or not
    failed = Facts(**{**followed.__dict__, "outcome": JOBSET_FAILED, "outcome_ns": now - 10 * S,
                      "outcome_reason": "JobSet x failed"})
    assert decide(failed, now).to_dict()["state"] == FAILED and decide(failed, now).reason == "JobSet x failed"
    # an end seen before a later step is stale: the run went on (e.g. its JobSet restarted)
    assert decide(Facts(**{**done.__dict__, "outcome_ns": now - 90 * S}), now).state == LIVE
    assert decide(Facts(**{**done.__dict__, "outcome_ns": now - 30 * S}), now).state == ENDED  # clock skew
    assert decide(Facts(from_cluster=True, followed_ns=now), now).reason == "followed; no step yet"


# -- the store ---------------------------------------------------------------------------------
def _followed(store, run: str, source: str = "kubernetes:default/x") -> None:
    with store.engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO run_sources (run, source, added_ns) VALUES (:r, :s, 1)"),
                     {"r": run, "s": source})


def test_states_in_the_store(db_url):  # noqa: F811
    store = open_store(db_url)
    try:
        samples = samples_dir()
        for run in ("saved", "done", "stuck", "gone", "broke"):
            ingest_sample(store, samples, run, "clean-300")  # stamped 2026-11-30: days old
        for run in ("done", "stuck", "gone", "broke"):
            _followed(store, run)
        assert heartbeat(store, ["done", "stuck", "broke", "nope"]) == {"done", "stuck", "broke"}
        assert record(store, "done", COMPLETED, "process 0 completed")
        assert not record(store, "done", COMPLETED, "process 0 completed")  # the same end: nothing written
        assert record(store, "broke", JOBSET_FAILED, "JobSet broke failed; its pod logs were not saved (logs_not_saved)")
        with store.engine.connect() as conn:
            got = {run: st.state for run, st in states(conn).items()}
        # the saved log was written a moment ago: still ingested, never `live`
        assert got == {"saved": INGESTED, "done": ENDED, "stuck": STALLED, "gone": UNKNOWN, "broke": FAILED}
        stuck = run_state(store, "stuck")
        assert "no step for" in stuck.reason and "per step" in stuck.reason, stuck
        assert run_state(store, "nope") is None
        # `runs --json`, the page's overview and the Python API say the same
        listed = json.loads(steptail("runs", "--db", db_url, "--json").stdout)
        assert {r["run"]: r["state"] for r in listed} == got
        assert "logs_not_saved" in {r["run"]: r for r in listed}["broke"]["state_reason"]
        from steptail.api import open as open_api
        from steptail.storage.page_reads import overview

        with open_api(db_url) as st:
            assert dict(zip(st.runs()["run"], st.runs()["state"], strict=True)) == got
        with store.engine.connect() as conn:
            assert {r["run"]: r["state"] for r in overview(conn, time.time_ns())} == got
    finally:
        store.dispose()


def test_the_fleet_dashboard_says_the_same_state(db_url):  # noqa: F811
    """The Fleet table's state column (SQL, PostgreSQL) is steptail.runs.state.decide's."""
    if not db_url.startswith("postgresql"):
        pytest.skip("Grafana reads PostgreSQL")
    from test_dashboards_sql import ctx, run_sql

    from steptail.dashboards import queries as q

    store = open_store(db_url)
    try:
        for run in ("saved", "done", "stuck", "gone", "broke", "fresh", "stale-end"):
            ingest_sample(store, samples_dir(), run, "clean-300")
            if run != "saved":
                _followed(store, run)
        heartbeat(store, ["done", "stuck", "broke", "fresh", "stale-end"])
        record(store, "done", COMPLETED, "process 0 completed")
        record(store, "broke", JOBSET_FAILED, "JobSet broke failed")
        record(store, "stale-end", COMPLETED, "process 0 completed", now_ns=1)  # steps came after it
        now = time.time_ns()
        with store.engine.begin() as conn:  # steps a second apart, the last one 10 s ago: live
            conn.execute(sa.text("UPDATE loss_summary SET last_ts_ns = :t, first_ts_ns = :t - CAST(hi - lo AS BIGINT) * :s"
                                 " WHERE run = 'fresh'"), {"t": now - 10 * S, "s": S})
        with store.engine.connect() as conn:
            expected = {run: s.state for run, s in states(conn).items()}
        assert expected == {"saved": INGESTED, "done": ENDED, "stuck": STALLED, "gone": UNKNOWN, "broke": FAILED,
                            "fresh": LIVE, "stale-end": STALLED}
        assert {r["run"]: r["state"] for r in run_sql(store, q.FLEET, ctx())} == expected
    finally:
        store.dispose()


def test_check_prints_the_stop_command_only_while_the_workload_is_admitted(db_url):  # noqa: F811
    store = open_store(db_url)
    try:
        for run in ("ended", "running"):
            ingest_sample(store, samples_dir(), run, "cp4-lb-nan")  # a non-finite CE: stop-worthy
            _followed(store, run)
        heartbeat(store, ["ended", "running"])
        record(store, "ended", COMPLETED, "process 0 completed")
    finally:
        store.dispose()
    proc = steptail("check", "ended", "--db", db_url)
    assert proc.returncode == 1 and "nonfinite_ce" in proc.stdout, proc.stderr
    assert "kubectl patch" not in proc.stdout
    assert "the run has ended (ended: process 0 completed): nothing to stop" in proc.stdout
    doc = json.loads(steptail("check", "ended", "--db", db_url, "--json").stdout)
    assert doc["stop_command"] is None and doc["state"]["state"] == ENDED
    proc = steptail("check", "running", "--db", db_url, "--workload", "wl-1", "-n", "team")
    assert proc.returncode == 1 and "kubectl patch workloads.kueue.x-k8s.io wl-1 -n team" in proc.stdout
    doc = json.loads(steptail("check", "running", "--db", db_url, "--json").stdout)
    assert doc["stop_command"].startswith("kubectl patch") and doc["state"]["state"] == LIVE  # no stamps: no stall


# -- follow, real kubectl against the simulated cluster ------------------------------------------
def _scenario(**trainer) -> dict:
    return {"rate": 20, "grace_seconds": 2, "restart_pending_seconds": 0.3,
            "jobsets": [{"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": 60, "checkpoint_period": 20,
                                                                       **trainer}}]}


def _follow(sim, db: str, *extra: str, stdout=subprocess.PIPE, stderr=subprocess.PIPE) -> subprocess.Popen:
    """A pipe no one reads while the run goes on fills at 64 KiB (about 110 steps of ndjson) and
    blocks the follower: a test that polls the store meanwhile passes files instead."""
    env = {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"} | {"CLOUDSDK_CORE_ACCOUNT": sim.account}
    return subprocess.Popen([*CLI, "follow", "--jobset", "olmo3-sft", "-n", "default", "--kubeconfig",
                             str(sim.kubeconfig_path), "--db", db, "--silence", "1", "--no-view", "--until-done",
                             "-o", "ndjson", *extra], stdout=stdout, stderr=stderr, text=True, env=env)


def _steps(db: str) -> int:
    try:
        store = open_store(db)
        try:
            with store.engine.connect() as conn:
                return conn.execute(sa.text("SELECT COUNT(*) FROM loss_parts")).scalar()
        finally:
            store.dispose()
    except Exception:  # noqa: BLE001 - not created yet
        return 0


def test_follow_until_done_of_a_completed_run_leaves_it_ended(make_simcluster, db_url):  # noqa: F811
    sim = make_simcluster(_scenario())
    proc = _follow(sim, db_url)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    listed = json.loads(steptail("runs", "--db", db_url, "--json").stdout)
    assert [(r["run"], r["state"]) for r in listed] == [("olmo3-sft", ENDED)], listed
    assert listed[0]["state_reason"] in ("process 0 completed", "JobSet olmo3-sft completed")


# reaped at once (the Failed JobSet and its deletion two events in a row, its pod's tail unread),
# or a moment later (the log read to its end first: the run is done then, logs not archived yet)
@pytest.mark.parametrize("reap_after", [0, 3])
def test_follow_until_done_ends_when_the_jobset_failed(make_simcluster, db_url, reap_after):  # noqa: F811
    sim = make_simcluster(_scenario(steps=100_000))
    proc = _follow(sim, db_url)
    try:
        deadline = time.monotonic() + 60
        while _steps(db_url) < 10 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        sim.fail_jobset("olmo3-sft", reap_after=reap_after)
        out, err = proc.communicate(timeout=90)  # before the fix: never ended
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    states_seen = [e["state"] for e in events if e["event"] == "state"]
    assert states_seen[-1] == "failed", states_seen
    flips = sum(1 for a, b in zip(states_seen, states_seen[1:], strict=False)
                if {a.split(":")[0], b.split(":")[0]} == {"waiting for process 0", "discovery failed"})
    assert flips <= 1, states_seen  # no flapping between the two
    summary = events[-1]
    assert summary["event"] == "summary", summary
    assert (summary["runs"][0]["state"], summary["runs"][0]["run_state"]) == (FAILED, FAILED), summary
    assert "olmo3-sft: run failed (JobSet olmo3-sft failed" in err
    if reap_after == 0:
        assert "failed and was deleted; its pod logs were not saved (logs_not_saved)" in err, err
    else:
        assert "its pod logs are not archived yet (steptail archive --jobset olmo3-sft)" in err, err
    listed = json.loads(steptail("runs", "--db", db_url, "--json").stdout)
    assert [(r["run"], r["state"]) for r in listed] == [("olmo3-sft", FAILED)], listed
    assert listed[0]["state_reason"].startswith("JobSet olmo3-sft failed")


def _state_of(db: str) -> dict:
    listed = json.loads(steptail("runs", "--db", db, "--json").stdout or "[]")
    return {r["run"]: r for r in listed}.get("olmo3-sft", {})


def test_a_followed_run_that_stops_stepping_is_stalled_then_live_again(make_simcluster, db_url):  # noqa: F811
    sim = make_simcluster(_scenario(steps=100_000))
    errors = tempfile.TemporaryFile("w+")
    proc = _follow(sim, db_url, stdout=subprocess.DEVNULL, stderr=errors)
    try:
        deadline = time.monotonic() + 60
        while _steps(db_url) < 10 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        deadline = time.monotonic() + 20  # its first heartbeat follows its first commit within a second
        while _state_of(db_url).get("state") != LIVE and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _state_of(db_url).get("state") == LIVE, _state_of(db_url)  # followed (its heartbeat), a step just now
        sim.stall("olmo3-sft", seconds=60)  # the pods keep running, the trainer writes nothing
        seen, deadline = [], time.monotonic() + 90
        while time.monotonic() < deadline and (not seen or seen[-1] != STALLED):
            seen.append(_state_of(db_url).get("state"))
            time.sleep(1)
        assert seen[-1] == STALLED, seen  # past the 30 s floor (3 × 0.05 s per step is less)
        assert "no step for" in _state_of(db_url)["state_reason"]
        before = _steps(db_url)
        sim.stall("olmo3-sft", seconds=0)  # seen stalled: the trainer writes again now, not at 60 s
        deadline = time.monotonic() + 60
        while _steps(db_url) == before and time.monotonic() < deadline:
            time.sleep(0.5)
        resumed = _steps(db_url) > before  # the trainer writes again
        state = _state_of(db_url).get("state")
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
        errors.seek(0)
        err = errors.read()
        errors.close()
    assert resumed and state == LIVE, (before, state, err[-6000:])
