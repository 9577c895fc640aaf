"""Chaos seed 114 (issue 19, new defect C): a pod deleted before its log was read to the end,
while following. The steps lost after the last one read are unknown by number, but lost: a
stream gap over the window and an `unread_tail` finding placed after the last step read (of
that stream's incarnation), which the chaos oracle takes as flagging them.

Real kubectl against the simulated cluster, checked against the simulator's truth."""

from __future__ import annotations

import pytest
from test_follow_support import assert_exactly_once, follow_sim, scenario
from test_follow_support import read as read_store

from steptail.runs.findings import NO_STEP, UNREAD_TAIL
from steptail.storage.reads import list_findings

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _account_env(monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")


def first_pod_s_tail(sim, tmp_path) -> tuple[dict, list[int], int, list[tuple]]:
    """Follow to the end; the steps of incarnation 1 never recorded, the last one read, and the
    unread_tail findings (incarnation, first step, last step, detail). Every lost step must lie
    inside a recorded stream gap (assert_exactly_once)."""
    db = str(tmp_path / "s.db")
    follow_sim(sim, db, timeout=90)
    r = assert_exactly_once(sim, db, "r")
    lost = sorted(s for i, s in {(t.incarnation, t.step) for t in r["truth"]} - r["got"] if i == 1)
    read = max(s for i, s in r["got"] if i == 1)
    tails = [(f[2], f[3], f[4], f[5]) for f in read_store(db, list_findings, "r") if f[1] == UNREAD_TAIL]
    return r, lost, read, tails


def test_a_pod_deleted_unread_while_following_is_a_gap_and_an_unread_tail_finding(make_simcluster, tmp_path):
    """The stream ends at step 80 as a 4 s auth lapse begins; the JobSet restarts at step 100
    with a 0.5 s grace, inside the lapse: steps 81-100 of the first pod are never read."""
    sim = make_simcluster(scenario(
        {"action": "eof_streams", "at_step": 80},
        {"action": "auth_lapse", "at_step": 80, "seconds": 4.0},
        {"action": "restart_jobset", "at_step": 100, "grace_seconds": 0.5},
        rate=20, jobsets=[{"name": "olmo3-sft", "hosts": 1, "trainer": {"steps": 200, "checkpoint_period": 50}}]))
    r, lost, read, tails = first_pod_s_tail(sim, tmp_path)
    assert lost and lost[-1] == 100 and lost[0] == read + 1  # the first pod's tail, never read
    assert {(2, s) for s in range(101, 201)} <= r["got"]
    assert len(tails) == 1, tails
    inc, first, last, detail = tails[0]
    assert (inc, first, last) == (1, read, read) and first != NO_STEP  # after the last step read
    assert "deleted before its log was read to the end" in detail and "lost" in detail


def test_a_tail_rotated_away_unread_before_the_container_ended_is_a_gap(make_simcluster, tmp_path):
    """Chaos seed 103 in CI (a loaded machine): the stream hangs on a rotation at step 100,
    steps 101-160 come fast, the file holding them rotates as the last is written and the
    container ends. The current file is empty: the re-read of the ended container returns no
    line at all, so nothing in it could say it did not reach back to the last line read."""
    sim = make_simcluster(scenario(
        {"action": "rotate", "at_step": 100},
        {"action": "set_rate", "at_step": 100, "steps_per_second": 400},
        {"action": "rotate", "at_step": 160},
        rate=20, jobsets=[{"name": "olmo3-sft", "hosts": 1, "trainer": {"steps": 160, "checkpoint_period": 50}}]))
    db = str(tmp_path / "s.db")
    follow_sim(sim, db, timeout=90)
    r = assert_exactly_once(sim, db, "r")  # every lost step lies inside a recorded stream gap
    lost = sorted(s for _, s in {(t.incarnation, t.step) for t in r["truth"]} - r["got"])
    read = max(s for _, s in r["got"])
    assert lost == list(range(read + 1, 161)), lost  # the tail, never served
    tails = [(f[2], f[3], f[4], f[5]) for f in read_store(db, list_findings, "r") if f[1] == UNREAD_TAIL]
    assert len(tails) == 1, "a tail lost unread is a finding, not silence"
    inc, first, last, detail = tails[0]
    assert (inc, first, last) == (1, read, read)  # after the last step read
    assert "served no line" in detail and "rotated away" in detail
    assert [reason for *_, reason in r["gaps"] if "served no line" in reason]


def test_an_ended_container_whose_last_line_read_is_still_served_has_no_unread_tail(make_simcluster, tmp_path):
    """The other side: a stream hung on a rotation, the container ends with lines in its
    current file. Its last read serves them: the loss (if any) is an ordinary rotation gap."""
    sim = make_simcluster(scenario(
        {"action": "rotate", "at_step": 100},
        rate=20, jobsets=[{"name": "olmo3-sft", "hosts": 1, "trainer": {"steps": 120, "checkpoint_period": 50}}]))
    db = str(tmp_path / "s.db")
    follow_sim(sim, db, timeout=90)
    r = assert_exactly_once(sim, db, "r")
    assert len(r["got"]) == 120
    assert not [f for f in read_store(db, list_findings, "r") if f[1] == UNREAD_TAIL]


def test_a_tail_rotated_away_before_a_preemption_notice_is_an_unread_tail(make_simcluster, tmp_path):
    """Chaos seed 106 in CI (a loaded machine): the stream hangs on a rotation at step 100,
    steps 101-160 come fast and their file rotates away; the JobSet is pre-empted at step 160,
    its notice the only lines of the current file. The old pod's last read serves that notice:
    the re-read finds the rotation gap, but no step after it bounds a gap finding — the lost
    tail is an unread_tail finding after the last step read, not a silent stream gap."""
    sim = make_simcluster(scenario(
        {"action": "rotate", "at_step": 100},
        {"action": "set_rate", "at_step": 100, "steps_per_second": 400},
        {"action": "rotate", "at_step": 160},
        {"action": "restart_jobset", "at_step": 160, "grace_seconds": 5.0},
        rate=20, jobsets=[{"name": "olmo3-sft", "hosts": 1, "trainer": {"steps": 200, "checkpoint_period": 50}}]))
    _, lost, read, tails = first_pod_s_tail(sim, tmp_path)
    assert lost == list(range(read + 1, 161)), lost  # the first pod's tail, never served
    assert len(tails) == 1, "a tail lost in a rotation is a finding, not silence"
    inc, first, last, detail = tails[0]
    assert (inc, first, last) == (1, read, read)  # after the last step read
    assert "no step was read after it" in detail
