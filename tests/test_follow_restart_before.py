"""Chaos seeds 101 and 112 (issue 19, new defect A): a container restarted in place before
`follow` reached its pod (before follow started, or while the follower was backing off). The
previous container is read with --previous as incarnation 1, the current one as incarnation 2,
each step once.

Real kubectl against the simulated cluster, checked against the simulator's truth."""

from __future__ import annotations

import threading

import pytest
from test_follow_support import assert_exactly_once, follow_sim, read, scenario

from steptail.runs.findings import GAP, HEAD_GAP
from steptail.storage.reads import list_findings

pytestmark = pytest.mark.timeout(120)

JOBSET = [{"name": "olmo3-sft", "hosts": 1, "trainer": {"steps": 200, "checkpoint_period": 50}}]


@pytest.fixture(autouse=True)
def _account_env(monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")


def _both_containers(sim, db: str) -> None:
    r = assert_exactly_once(sim, db, "r")
    assert {(1, s) for s in range(1, 61)} <= r["got"], sorted(r["got"])[:5]  # the previous container
    assert {(2, s) for s in range(51, 201)} <= r["got"]  # the current one, from its checkpoint
    assert not r["lost"] and not r["gaps"]


def test_a_container_restarted_before_follow_starts(make_simcluster, tmp_path):
    sim = make_simcluster(scenario({"action": "restart_container", "at_step": 60}, rate=20, jobsets=JOBSET))
    sim.wait_step(70, timeout=30)  # the current container runs; --previous holds steps 1-60
    db = str(tmp_path / "s.db")
    follow_sim(sim, db, timeout=90)
    _both_containers(sim, db)


def test_a_container_restarted_while_the_follower_backs_off(make_simcluster, tmp_path):
    """Log reads fail (503) from step 40; the container restarts at step 60 during the waits."""
    sim = make_simcluster(scenario(
        {"action": "eof_streams", "at_step": 40},
        {"action": "fail_next", "at_step": 40, "n": 5, "code": 503, "path": "/log"},
        {"action": "restart_container", "at_step": 60}, rate=20, jobsets=JOBSET))
    db = str(tmp_path / "s.db")
    follow_sim(sim, db, timeout=90)
    _both_containers(sim, db)


def test_a_container_restarted_as_follow_opens_its_first_stream(make_simcluster, tmp_path):
    """The seed-101 race, made certain: the first `kubectl logs -f` is held by the server
    (hang_api) and the watch is quiet (the view still says restartCount 0) while the container
    restarts. The stream then serves the new container, which kubectl does not name: its
    lines must not be filed as the old container's (the old one would never be read and the
    new one recorded twice)."""
    sim = make_simcluster(scenario(rate=20, jobsets=[
        {"name": "olmo3-sft", "hosts": 1, "trainer": {"steps": 200, "checkpoint_period": 20}}]))
    # the first stream is held until just after the restart (a probe of the quiet stream
    # before it finds nothing unread, so the stream is kept: the race as the chaos seed met it)
    sim.hang_api(seconds=3.5, path="follow=true")
    sim.hang_api(seconds=12.0, path="watch=true", streams=True)  # discovery's view stays stale
    timer = threading.Timer(3.0, sim.restart_container)
    timer.start()
    db = str(tmp_path / "s.db")
    try:
        follow_sim(sim, db, timeout=90, silence=30.0)
    finally:
        timer.cancel()
    r = assert_exactly_once(sim, db, "r")  # incarnations as the trainer numbered them, each step once
    truth = r["truth"]
    assert {t.restart_count for t in truth} == {0, 1}
    assert {(t.incarnation, t.step) for t in truth} == r["got"]


def test_a_restart_whose_start_up_rotated_away_before_follow_starts_is_a_new_incarnation(make_simcluster, tmp_path):
    """Seeds 102 and 112: the container restarts at step 60 (restoring from 50) and its log
    rotates after its start-up, restore line and 30 steps; follow starts later. --previous
    holds steps 1-60; the current container's file begins at step 81, going forward: only the
    new container (a new stream key) says it is another trainer process."""
    sim = make_simcluster(scenario({"action": "restart_container", "at_step": 60, "head_rotated": 30},
                                   rate=20, jobsets=JOBSET))
    sim.wait_step(100, timeout=30)
    db = str(tmp_path / "s.db")
    follow_sim(sim, db, timeout=90)
    r = assert_exactly_once(sim, db, "r")
    assert {(1, s) for s in range(1, 61)} <= r["got"]
    assert {(2, s) for s in range(81, 201)} <= r["got"]
    # seeds 105, 106: the steps lost are the restart's replay from the checkpoint saved at 50,
    # 51-80, though incarnation 1 reached 60: the head gap says so, not 61-80 only
    lost = sorted((t.incarnation, t.step) for t in r["lost"])
    assert lost == [(2, s) for s in range(51, 81)], lost
    heads = [tuple(f[1:5]) for f in read(db, list_findings, "r") if f[1] in (GAP, HEAD_GAP)]
    assert heads == [("head_gap", 2, 51, 80)]


def test_a_previous_container_whose_head_rotated_away_before_follow_starts(make_simcluster, tmp_path):
    """Seed 106 (on PostgreSQL): the first container's log rotated twice (2 files kept) before
    it restarted at step 40 (from checkpoint 0); follow starts later and reads it first with
    --previous, which begins after a rotation. Its head is a stream gap from the container's
    start (lastState.terminated.startedAt), not from the first line read, and a head gap."""
    sim = make_simcluster(scenario({"action": "rotate", "at_step": 20}, {"action": "rotate", "at_step": 30},
                                   {"action": "restart_container", "at_step": 40},
                                   rate=20, jobsets=JOBSET, log_max_files=2))
    sim.wait_step(60, timeout=30)
    db = str(tmp_path / "s.db")
    follow_sim(sim, db, timeout=90)
    r = assert_exactly_once(sim, db, "r")
    # what --previous serves begins after a rotation: the lost are the head, rotated away unread
    first = min(s for i, s in r["got"] if i == 1)
    assert first in (21, 31)
    assert sorted((t.incarnation, t.step) for t in r["lost"]) == [(1, s) for s in range(1, first)]
    assert all(t.rotated and not t.served for t in r["lost"])
    assert [g[0].rsplit("/", 1)[1] for g in r["gaps"]] == ["0"]  # the previous container's head only
    assert {(2, s) for s in range(1, 201)} <= r["got"]  # restored from no checkpoint
    heads = [tuple(f[1:5]) for f in read(db, list_findings, "r") if f[1] in (GAP, HEAD_GAP)]
    assert heads == [("head_gap", 1, 1, first - 1)]
