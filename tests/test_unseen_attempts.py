"""Which JobSet restart attempts ran and ended unseen (collector.live.unseen_attempts)."""

from __future__ import annotations

import threading
import time

import pytest
from test_follow_support import findings, follow_sim, gaps, recorded, scenario

from steptail.collector.cluster.discovery import PodInfo
from steptail.collector.live.unseen_attempts import unseen_attempts
from steptail.runs.stream_gap import unseen_attempt_stream

S = 1_000_000_000  # ns


def pod(attempt: int, created_s: int | None) -> PodInfo:
    return PodInfo(name=f"js-a{attempt}", uid=f"uid-{attempt}", jobset="js", attempt=attempt, created="",
                   phase="Running", deleting=False, container="train", restart_count=0, state="running",
                   reason="", finished_ns=None, started_ns=None, previous_finished_ns=None,
                   created_ns=None if created_s is None else created_s * S)


def test_an_attempt_skipped_between_two_seen_is_unseen_from_the_last_seen():
    assert unseen_attempts([(0, 10 * S)], pod(2, 30), None) == (range(1, 2), 10 * S)
    assert unseen_attempts([(0, 10 * S), (1, 20 * S)], pod(4, 30), None) == (range(2, 4), 20 * S)


def test_the_next_attempt_or_a_sibling_of_one_seen_claims_nothing():
    for seen, p in (([(0, S)], pod(1, 30)), ([(2, S)], pod(2, 30)), ([], pod(0, 30)), ([(3, S), (1, S)], pod(2, 30))):
        assert unseen_attempts(seen, p, 5 * S) == (range(0), None)


def test_a_first_pod_claims_the_attempt_before_only_when_created_after_pods_went_unseen():
    assert unseen_attempts([], pod(3, 30), 20 * S) == (range(2, 3), 20 * S)
    assert unseen_attempts([], pod(3, 30), None) == (range(0), None)  # listed from the start: nothing
    assert unseen_attempts([], pod(3, 20), 20 * S) == (range(0), None)  # restarted before the blind span
    assert unseen_attempts([], pod(3, None), 20 * S) == (range(0), None)


# ---- live: real kubectl and the simulated cluster ----
RESTARTED = {"rate": 20, "jobsets": [{"name": "olmo3-sft", "hosts": 2,
                                      "trainer": {"steps": 200, "checkpoint_period": 50}}]}

ATTEMPT_STREAMS = {unseen_attempt_stream(a) for a in range(3)}


def _restarted_once(make_simcluster):
    """A JobSet on its restart attempt 1 (resumed from step 50), process 0 at step 60."""
    sim = make_simcluster(scenario(**RESTARTED))
    sim.wait_step(55)
    sim.restart_jobset(grace_seconds=0.0, pending_seconds=0.2)
    sim.wait_step(60, incarnation=2)
    return sim


@pytest.mark.timeout(120)
def test_an_attempt_that_lived_and_ended_while_pods_could_not_be_listed_is_a_gap_and_a_finding(
        make_simcluster, tmp_path, monkeypatch):
    """Chaos seed 196's way: follow starts while 502s refuse its pod lists (~6.5 s of retries);
    1.2 s after the first refusal, the JobSet restarts again (grace 0). Attempt 1's pod lived and went unseen, its
    lines from the follower's start on lost with no uid to find a stream gap in: the next pod
    (attempt 2) tells of it — a stream gap for the attempt and an unread_tail finding. Attempt 2
    is read whole."""
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")
    sim = _restarted_once(make_simcluster)
    sim.fail_next(14, code=502, path="/pods")
    stop = threading.Event()

    def restart_once_refused() -> None:
        # 1.2 s after the first refused list: a pod's creationTimestamp is whole seconds, and one
        # stamped the second follow began is not taken to be after it
        while not stop.is_set() and not any(code == 502 for *_, code in sim.requests):
            time.sleep(0.02)
        if not stop.wait(1.2):
            sim.restart_jobset(grace_seconds=0.0, pending_seconds=0.2)

    again = threading.Thread(target=restart_once_refused, daemon=True)
    again.start()
    db = str(tmp_path / "s.db")
    try:
        sup = follow_sim(sim, db, timeout=90)
    finally:
        stop.set()
        again.join(5)
    truth = sim.truth()
    third = {t.step for t in truth if t.attempt == 2}
    assert recorded(db, "r") == [(1, s) for s in sorted(third)]
    assert max(t.step for t in truth if t.attempt == 1) > 61  # it wrote on after follow began
    assert [s for s, *_ in gaps(db, "r") if s in ATTEMPT_STREAMS] == [unseen_attempt_stream(1)]
    tails = [d for k, d in findings(db, "r") if k == "unread_tail"]
    assert len(tails) == 1 and "restart attempt 1 of JobSet olmo3-sft ran and ended unseen" in tails[0], tails
    assert "pod discovery was failing" in tails[0]  # the collector's fault that lost it, named
    assert sup.discovery.health.counts == {"server_error": 14}


@pytest.mark.timeout(120)
def test_a_follow_begun_after_a_restart_with_pods_listed_claims_no_unseen_attempt(
        make_simcluster, tmp_path, monkeypatch):
    """The same JobSet followed from its attempt 1 with the API answering: attempt 0 ended
    before the collector began (a late start, not a loss it could have prevented)."""
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")
    sim = _restarted_once(make_simcluster)
    db = str(tmp_path / "s.db")
    follow_sim(sim, db, timeout=90)
    assert not [s for s, *_ in gaps(db, "r") if s in ATTEMPT_STREAMS]
    assert "unread_tail" not in {k for k, _ in findings(db, "r")}
    assert {s for _, s in recorded(db, "r")} == {t.step for t in sim.truth() if t.attempt == 1}
