"""Issue 19, defect 1: back-off does not pile up across different failures, and a pod being
deleted is read before a back-off ends. Issue 20, item 6 (second half): a stream gap is
recorded (and logged) once, however long the watch's view of the pod stays stale.

Real kubectl against the simulated cluster, checked against the simulator's truth."""

from __future__ import annotations

import logging

import pytest
from test_follow_support import assert_exactly_once, follow_sim, gaps, scenario

from steptail.collector.notify.health import Health

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _account_env(monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")


def test_backoff_doubles_within_one_kind_and_restarts_on_a_new_kind_or_a_success():
    h = Health("follower", "r")
    waits = []
    for kind in ["auth"] * 4 + ["server_error"] * 3:
        h.fail(kind, "x")
        waits.append(h.backoff(15.0))
    assert waits == [0.25, 0.5, 1.0, 2.0, 0.25, 0.5, 1.0]
    h.ok()
    assert h.backoff(15.0) == 0.0
    h.fail("server_error", "x")
    assert h.backoff(15.0) == 0.25  # a success ends the spell: no wait carried over
    for _ in range(10):
        h.fail("server_error", "x")
    assert h.backoff(15.0) == 15.0  # capped


def test_auth_lapse_then_503s_then_a_restart_loses_nothing(make_simcluster, tmp_path):
    """The issue's sequence: an auth lapse, 503s right after it, and a JobSet restart whose
    grace period ends while the follower would still have been backing off (0.25 → … → 15 s
    when the waits carried over). Every step of the old pod is read before it is deleted."""
    sim = make_simcluster(scenario(
        {"action": "eof_streams", "at_step": 40},  # the open stream ends: reconnects meet the lapse
        {"action": "auth_lapse", "at_step": 40, "seconds": 3.0},
        {"action": "fail_next", "at_step": 40, "n": 3, "code": 503, "path": "/log"},
        {"action": "restart_jobset", "at_step": 110, "grace_seconds": 8.0},
        rate=20, jobsets=[{"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": 160, "checkpoint_period": 50}}]))
    db = str(tmp_path / "s.db")
    sup = follow_sim(sim, db, timeout=90)
    r = assert_exactly_once(sim, db, "r")
    assert {(1, s) for s in range(1, 111)} <= r["got"]  # the old pod, read to its end in time
    assert {(2, s) for s in range(101, 161)} <= r["got"]
    assert not r["lost"] and not r["gaps"]
    st = sup.status["r"]
    assert st.errors.get("auth", 0) >= 1 and st.errors.get("server_error", 0) >= 1


def test_backoff_is_cut_short_by_a_deleting_pod(make_simcluster, tmp_path):
    """Six 503s in a row on log reads: the follower waits 0.25, 0.5, … 8 s (one kind: the
    back-off grows, rightly). A JobSet restart with a 3 s grace during the 8 s wait: the wait
    ends when the old pod shows its deletionTimestamp, a 503 still queued costs at most 0.1 s
    while the pod holds unread lines, and the old pod is read to its end."""
    sim = make_simcluster(scenario(
        {"action": "eof_streams", "at_step": 40},
        {"action": "fail_next", "at_step": 40, "n": 6, "code": 503, "path": "/log"},
        {"action": "restart_jobset", "at_step": 220, "grace_seconds": 3.0},
        rate=20, jobsets=[{"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": 300, "checkpoint_period": 50}}]))
    db = str(tmp_path / "s.db")
    follow_sim(sim, db, timeout=90)
    r = assert_exactly_once(sim, db, "r")
    assert {(1, s) for s in range(1, 221)} <= r["got"]
    assert {(2, s) for s in range(201, 301)} <= r["got"]
    assert not r["lost"] and not r["gaps"]


def test_a_gap_is_recorded_once_while_the_watch_is_stale(make_simcluster, tmp_path, caplog):
    """Pod list/watch fail (here: undeserializable pods) while the pod is deleted at once: the watch's view
    still lists the pod for seconds. The follower learns from a fresh read that it is gone —
    once: one stream gap, one log line (it was recorded on every pass, 39 times in 0.5 s)."""
    sim = make_simcluster(scenario(
        {"action": "corrupt_pods", "at_step": 60, "seconds": 3.0},
        {"action": "restart_jobset", "at_step": 62, "grace_seconds": 0.0},
        rate=20))
    db = str(tmp_path / "s.db")
    caplog.set_level(logging.INFO, logger="steptail")
    follow_sim(sim, db, timeout=90)
    r = assert_exactly_once(sim, db, "r")
    old = {t.pod_uid for t in r["truth"] if t.incarnation == 1}
    old_gaps = [g for g in gaps(db, "r") if g[0].split("/")[0] in old]
    assert len(old_gaps) == 1, old_gaps
    logged = [rec for rec in caplog.records if "stream gap on" in rec.getMessage()
              and rec.getMessage().split("stream gap on ")[1].split("/")[0] in old]
    assert len(logged) == 1, [rec.getMessage() for rec in logged]


def test_repeated_log_lines_are_collapsed_with_a_count(caplog):
    from steptail.collector.notify.health import Repeats

    logger = logging.getLogger("steptail.test-repeats")
    logger.addFilter(Repeats(window=60.0))
    try:
        with caplog.at_level(logging.INFO, logger="steptail.test-repeats"):
            for _ in range(39):
                logger.warning("r: stream gap on %s: %s", "uid/jax-tpu/0", "pod deleted")
            logger.info("r: follower ok again")
            logger.info("r: follower ok again")
        lines = [rec.getMessage() for rec in caplog.records if rec.name == "steptail.test-repeats"]
    finally:
        logger.filters.clear()
    assert lines == ["r: stream gap on uid/jax-tpu/0: pod deleted",
                     "r: stream gap on uid/jax-tpu/0: pod deleted (repeated 38 more times)",
                     "r: follower ok again"]


def test_a_wait_the_server_named_is_honoured_exactly():
    """A 429 with Retry-After: 1 waits 1 s each time, never doubled on top nor cut to the cap;
    a recovery elsewhere does not cut it short. A failure with no wait named doubles as ever."""
    from kubernetes.client.exceptions import ApiException

    from steptail.collector.cluster.discovery import reason_of, retry_after

    exc = ApiException(status=429, reason="Too Many Requests")
    exc.headers, exc.body = {"Retry-After": "1"}, '{"message": "Too many requests", "details": {"retryAfterSeconds": 1}}'
    assert retry_after(exc) == 1.0 and reason_of(exc)[0] == "server_error"
    bare = ApiException(status=503, reason="Service Unavailable")
    assert retry_after(bare) is None
    h = Health("follower", "r")
    waits = []
    for _ in range(4):
        h.fail("server_error", "429", retry_after=retry_after(exc))
        waits.append(h.backoff(0.5))
    assert waits == [1.0] * 4 and h.told_to_wait
    h.fail("server_error", "503")
    assert h.backoff(15.0) == 4.0 and not h.told_to_wait  # same kind, no wait named: the doubling (5th failure)


def test_any_answer_wakes_the_waiting_sources_once_per_failure():
    from steptail.collector.notify.health import Recovery

    recovery, woken = Recovery(), []
    recovery.listeners.append(lambda: woken.append(1))
    recovery.answered()
    assert not woken  # nothing failing: an answer wakes nobody
    follower = Health("follower", "r", recovery=recovery)
    follower.fail("server_error", "503")
    recovery.answered()
    recovery.answered()
    assert len(woken) == 1  # once per failure: a source failing alone is not woken at every answer
