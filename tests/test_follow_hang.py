"""Hang detection with default options (real kubectl, simulated cluster): a rotation hang is
noticed by the stream's own pace whatever the line rate, and a container that is merely
quiet is left alone (no reconnect storm, no false stream gap)."""

from __future__ import annotations

import pytest
from test_follow_support import assert_exactly_once, findings, follow_sim, reconnects, scenario

from steptail.collector.live.follower import FollowConfig
from steptail.collector.live.watchdog import FLOOR, Pace, Watchdog

LINES_PER_STEP = 6.7  # the simulated trainer's process 0 writes ~6-7 lines per step
DEFAULT_SILENCE = FollowConfig().silence


@pytest.fixture(autouse=True)
def _account_env(monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("lines_per_s, first_at", [(2, 12.0), (20, 4.0), (200, 3.0)])
def test_rotation_hang_then_a_second_rotation_8s_later_loses_nothing(make_simcluster, tmp_path,
                                                                     lines_per_s, first_at):
    rate = lines_per_s / LINES_PER_STEP
    steps = int(rate * (first_at + 8 + 10)) + 1  # ten seconds of steps after the second rotation
    sim = make_simcluster(scenario({"action": "rotate", "at": first_at}, {"action": "rotate", "at": first_at + 8},
                                   rate=rate, jobsets=[{"name": "olmo3-sft", "hosts": 1,
                                                        "trainer": {"steps": steps, "checkpoint_period": 1000}}]))
    db = str(tmp_path / "s.db")
    follow_sim(sim, db, silence=DEFAULT_SILENCE, timeout=first_at + 60)
    r = assert_exactly_once(sim, db, "r")
    assert len(r["got"]) == steps, f"lost {sorted(set(range(1, steps + 1)) - {s for _, s in r['got']})}"
    # A re-read after a rotation cannot reach back to the last line read, so each hang leaves
    # a window "lines in between, if any, are lost"; here none were, and no step is flagged.
    assert len(r["gaps"]) <= 2 and all("rotated" in reason for *_, reason in r["gaps"])
    assert not [k for k, _ in findings(db, "r") if k in ("gap", "head_gap")]
    assert dict(reconnects(db, "r")).get("silence", 0) >= 2  # both hangs were noticed


@pytest.mark.timeout(150)
def test_a_container_quiet_for_60s_is_not_a_hang(make_simcluster, tmp_path):
    sim = make_simcluster(scenario({"action": "stall", "at_step": 40, "seconds": 60},
                                   jobsets=[{"name": "olmo3-sft", "hosts": 1,
                                             "trainer": {"steps": 80, "checkpoint_period": 1000}}]))
    db = str(tmp_path / "s.db")
    sup = follow_sim(sim, db, silence=DEFAULT_SILENCE, timeout=120)
    r = assert_exactly_once(sim, db, "r")
    assert len(r["got"]) == 80 and not r["gaps"]
    assert not [k for k, _ in findings(db, "r") if k in ("gap", "head_gap")]
    assert not reconnects(db, "r")
    log_requests = [p for _, p, _ in sim.requests if p.split("?")[0].endswith("/log")]
    # one follow stream, the probes of the quiet minute (at most one per 5 s), nothing else
    assert sup.followers["r"].read.probes <= 60 / 5
    assert len(log_requests) <= 1 + 60 / 5, log_requests


def _pace(*ts_s: float) -> Pace:
    pace = Pace()
    for t in ts_s:
        pace.see(int(t * 1e9))
    return pace


def test_the_threshold_follows_the_stream_s_pace():
    assert Watchdog(Pace(), cap=30).threshold() == FLOOR  # nothing known yet
    # a step every 12 s, its lines in a burst of 4 ms: 1.5 x the 11.996 s of quiet between bursts
    # (issue 33: the pace is the quiet gaps, no longer burst start to burst start, 12 s)
    steps = [t for s in range(10) for t in (12.0 * s, 12.0 * s + 0.002, 12.0 * s + 0.004)]
    assert Watchdog(_pace(*steps), cap=30).threshold() == pytest.approx(1.5 * 11.996)
    assert Watchdog(_pace(*steps), cap=10).threshold() == 10  # --silence bounds it
    assert Watchdog(_pace(*[0.05 * i for i in range(100)]), cap=30).threshold() == FLOOR  # chatty
    # a reconnect's overlap (timestamps going back) is not a burst
    assert _pace(10.0, 11.0, 10.5, 11.0).intervals == _pace(10.0, 11.0).intervals


def test_checks_of_a_quiet_stream_back_off_to_the_cap():
    w = Watchdog(Pace(), cap=30)
    checks = []
    while (at := w.next_check) <= 300:
        checks.append(at)
        w.quiet_confirmed(at)
    assert checks[:5] == [2, 6, 14, 30, 60]
    assert all(b - a == 30 for a, b in zip(checks[4:], checks[5:], strict=False))
    w.reset()
    assert w.next_check == FLOOR


def test_a_look_the_api_refused_is_tried_again_soon():
    w = Watchdog(Pace(), cap=30)
    checks = []
    for _ in range(5):  # the pod cannot be asked: soon again, doubling, at most a threshold
        checks.append(w.next_check)
        w.unknown(w.next_check)
    assert checks == [2, 2.5, 3.5, 5.5, 7.5]
    w.quiet_confirmed(w.next_check)  # then it answers: the quiet back-off starts where it was
    assert w.next_check == 9.5 + 4
    w.unknown(w.next_check)
    assert w.next_check == 13.5 + 0.5


@pytest.mark.timeout(150)
def test_a_rotation_hang_while_the_pod_cannot_be_asked_loses_nothing(make_simcluster, tmp_path):
    """The log rotates (the stream hangs) and the first three looks at the pod answer 502; a
    second rotation follows 10 s later. The looks are tried again within seconds, so the
    stream is re-opened before the second rotation, not after --silence: nothing is lost."""
    rate = 20 / LINES_PER_STEP
    steps = int(rate * 24)
    sim = make_simcluster(scenario({"action": "rotate", "at": 4.0}, {"action": "rotate", "at": 14.0},
                                   {"action": "fail_next", "at": 4.0, "code": 502, "n": 3, "path": "tailLines"},
                                   rate=rate, jobsets=[{"name": "olmo3-sft", "hosts": 1,
                                                        "trainer": {"steps": steps, "checkpoint_period": 1000}}]))
    db = str(tmp_path / "s.db")
    follow_sim(sim, db, silence=DEFAULT_SILENCE, timeout=90)
    assert [o for o in sim.truth.unavailable() if o.kind == "fail_next"][0].to_ns is not None  # all 3 answered
    r = assert_exactly_once(sim, db, "r")
    assert len(r["got"]) == steps, f"lost {sorted(set(range(1, steps + 1)) - {s for _, s in r['got']})}"
    assert not [k for k, _ in findings(db, "r") if k in ("gap", "head_gap")]
