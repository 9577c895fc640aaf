"""One test per fault a follower must survive (rotation hang, EOF, unread rotated lines,
JobSet and container restarts, auth lapse, Pending): the collector (real kubectl over HTTPS)
against the simulated cluster, compared with the simulator's ground truth."""

from __future__ import annotations

import pytest
from test_follow_support import (
    assert_exactly_once,
    collector_events,
    findings,
    follow_sim,
    kubectl_procs,
    reconnects,
    scenario,
)

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(autouse=True)
def _account_env(monkeypatch):
    # the API client's exec plugin reads the account from this process's environment
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")


def _db(tmp_path) -> str:
    return str(tmp_path / "s.db")


def test_clean_run_every_step_once_and_parquet_matches(make_simcluster, tmp_path, db_url):
    """On SQLite and on the real PostgreSQL."""
    from steptail.storage.parquet import read_table

    sim = make_simcluster(scenario({"action": "restart_jobset", "at_step": 130}))
    sup = follow_sim(sim, db_url, parquet=str(tmp_path / "pq"))
    r = assert_exactly_once(sim, db_url, "r")
    assert len(r["got"]) == 160 + 30 and not r["gaps"]  # 1..130, then 101..160 after the restart
    st = sup.status["r"]
    assert st.done and st.last_step == 160 and st.failures == 0
    lp = read_table(tmp_path / "pq", "loss_parts", "r").to_pydict()
    assert sorted(zip(lp["incarnation"], lp["step"], strict=True)) == sorted(r["got"])
    assert not kubectl_procs(str(sim.kubeconfig_path))


def test_rotation_hang_is_restarted_by_the_silence_watchdog(make_simcluster, tmp_path):
    sim = make_simcluster(scenario({"action": "rotate", "at_step": 60}))
    sup = follow_sim(sim, _db(tmp_path))
    r = assert_exactly_once(sim, _db(tmp_path), "r")
    assert len(r["got"]) == 160  # nothing was lost: the hang was only a hang
    assert sup.status["r"].reconnects >= 1
    assert ("silence", sup.status["r"].reconnects) in reconnects(_db(tmp_path), "r")


def test_lines_rotated_away_unread_lie_inside_a_recorded_gap(make_simcluster, tmp_path):
    # two rotations within one silence period: the middle file is never served
    sim = make_simcluster(scenario({"action": "rotate", "at_step": 60}, {"action": "rotate", "at_step": 70}))
    follow_sim(sim, _db(tmp_path), silence=1.5)
    r = assert_exactly_once(sim, _db(tmp_path), "r")
    unread = [t.step for t in r["truth"] if t.rotated_unread]
    assert unread and set(unread) <= set(range(61, 71))
    assert any("rotated" in reason for *_, reason in r["gaps"])


def test_eof_reconnects_with_since_time_and_drops_the_overlap(make_simcluster, tmp_path):
    sim = make_simcluster(scenario({"action": "eof_streams", "at_step": 50},
                                   {"action": "eof_streams", "at_step": 100}))
    sup = follow_sim(sim, _db(tmp_path))
    r = assert_exactly_once(sim, _db(tmp_path), "r")
    assert len(r["got"]) == 160 and not r["gaps"]
    assert sup.status["r"].reconnects >= 2
    assert sum(n for _, n in reconnects(_db(tmp_path), "r")) == sup.status["r"].reconnects
    assert dict(reconnects(_db(tmp_path), "r")).get("eof", 0) >= 2
    reconnect_reads = [q for m, q, code in sim.requests if "/log" in q and "sinceTime" in q]
    assert len(reconnect_reads) >= 2


def test_jobset_restart_moves_to_the_replacement_pod(make_simcluster, tmp_path):
    sim = make_simcluster(scenario({"action": "restart_jobset", "at_step": 120}))
    first = sim.process0()
    follow_sim(sim, _db(tmp_path))
    r = assert_exactly_once(sim, _db(tmp_path), "r")
    assert {(1, 120), (2, 101), (2, 160)} <= r["got"]  # resumed from the checkpoint at 100
    pods = {t.pod for t in r["truth"]}
    assert first in pods and sim.process0() in pods and len(pods) == 2


def test_old_pod_is_drained_after_a_restart_during_a_hang(make_simcluster, tmp_path):
    sim = make_simcluster(scenario({"action": "rotate", "at_step": 100},
                                   {"action": "restart_jobset", "at_step": 105}))
    follow_sim(sim, _db(tmp_path), silence=1.0)
    r = assert_exactly_once(sim, _db(tmp_path), "r")
    # 101..105 sat in the old pod's new file behind a hung stream: read by the drain
    assert {(1, s) for s in range(101, 106)} <= r["got"]


def test_pod_deleted_before_drain_becomes_a_stream_gap(make_simcluster, tmp_path):
    sim = make_simcluster(scenario({"action": "rotate", "at_step": 100},
                                   {"action": "restart_jobset", "at_step": 105, "grace_seconds": 0.05}))
    follow_sim(sim, _db(tmp_path), silence=1.5)
    r = assert_exactly_once(sim, _db(tmp_path), "r")
    lost = {(t.incarnation, t.step) for t in r["lost"]}
    assert {(1, s) for s in range(101, 106)} <= lost
    assert any("deleted before" in reason for *_, reason in r["gaps"])


def test_container_restart_in_place_reads_previous(make_simcluster, tmp_path):
    # the rotation hang keeps the stream from reaching the old container's end: --previous does
    sim = make_simcluster(scenario({"action": "rotate", "at_step": 90},
                                   {"action": "restart_container", "at_step": 95}))
    follow_sim(sim, _db(tmp_path), silence=1.0)
    r = assert_exactly_once(sim, _db(tmp_path), "r")
    assert {(1, s) for s in range(91, 96)} <= r["got"]
    assert (2, 51) in r["got"] and (2, 160) in r["got"]
    assert any("previous=true" in q for _, q, code in sim.requests if code == 200)


def test_collector_started_after_a_container_restart_reads_previous_first(make_simcluster, tmp_path):
    sim = make_simcluster(scenario({"action": "restart_container", "at_step": 30}))
    sim.wait_step(60, incarnation=2)
    follow_sim(sim, _db(tmp_path))
    r = assert_exactly_once(sim, _db(tmp_path), "r")
    assert {(1, 1), (1, 30), (2, 1), (2, 160)} <= r["got"]  # no checkpoint yet: restarted at step 1


def test_auth_lapse_surfaces_with_its_reason_and_recovers(make_simcluster, tmp_path):
    sim = make_simcluster(scenario({"action": "auth_lapse", "at_step": 60, "seconds": 1.5},
                                   {"action": "eof_streams", "at_step": 61}))
    sup = follow_sim(sim, _db(tmp_path))
    r = assert_exactly_once(sim, _db(tmp_path), "r")
    assert len(r["got"]) == 160
    st = sup.status["r"]
    assert st.failures >= 1
    failures = [f for f in sup.detectors["r"].failures if f.kind == "auth"]
    assert failures and "auth" in failures[0].reason.lower()
    # a lapse that lost nothing is the collector's health, not a finding of the run (issue 32)
    assert not any(kind == "auth_failure" for kind, _ in findings(_db(tmp_path), "r"))
    events = collector_events(_db(tmp_path), "r")
    (event,) = [e for e in events if e["run"] == "r"]
    assert event["kind"] == "auth_failure" and event["source"] == "follower" and event["cleared"] is not None
    assert "Reauthentication failed" in event["reason"] and not event["lost_steps"], event
    # pod discovery's lapse too: one event for every run, cleared
    assert all(e["kind"] == "auth_failure" and e["cleared"] for e in events if e["run"] is None), events


def test_server_errors_are_retried(make_simcluster, tmp_path):
    sim = make_simcluster(scenario({"action": "fail_next", "at_step": 40, "n": 2, "code": 503, "path": "/log"},
                                   {"action": "eof_streams", "at_step": 41}))
    sup = follow_sim(sim, _db(tmp_path))
    assert len(assert_exactly_once(sim, _db(tmp_path), "r")["got"]) == 160
    kinds = {f.kind for f in sup.detectors["r"].failures}
    assert "server_error" in kinds


def test_pending_pod_is_waited_for_and_read_from_before_step_1(make_simcluster, tmp_path):
    import sqlalchemy as sa

    from steptail.storage.db import open_store

    sc = scenario()
    sc["jobsets"][0]["pending_seconds"] = 1.5
    sim = make_simcluster(sc)
    follow_sim(sim, _db(tmp_path))
    r = assert_exactly_once(sim, _db(tmp_path), "r")
    assert (1, 1) in r["got"]
    store = open_store(_db(tmp_path))
    with store.engine.connect() as c:
        saw = c.execute(sa.text("SELECT saw_start FROM incarnations WHERE run='r' AND incarnation=1")).scalar()
    store.dispose()
    assert saw
