"""Issue 33, item 4 (second defect): hang detection measured from quiet gaps. A stream that
writes steadily (its lines closer than a burst) was one endless burst, and its first short
pause (a checkpoint save) read as a "usual interval" as long as the whole stream so far: the
hang threshold climbed to `--silence`, and a second rotation took the lines meanwhile.

Real kubectl against the simulated cluster, checked against the simulator's truth."""

from __future__ import annotations

import pytest
from test_follow_support import assert_exactly_once, findings, follow_sim, reconnects, scenario

from steptail.collector.live.follower import FollowConfig
from steptail.collector.live.watchdog import FLOOR, Pace, Watchdog

DEFAULT_SILENCE = FollowConfig().silence


@pytest.fixture(autouse=True)
def _account_env(monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")


def _steady(pace: Pace, start_s: float, seconds: float, per_s: float) -> float:
    """Lines every 1/per_s seconds (closer than a burst) for `seconds`; the last stamp."""
    n = int(seconds * per_s)
    for i in range(n):
        pace.see(int((start_s + i / per_s) * 1e9))
    return start_s + (n - 1) / per_s


def test_a_steady_stream_s_short_pause_is_its_usual_interval():
    pace = Pace()
    last = _steady(pace, 0.0, 30.0, 40)  # 40 lines/s for 30 s: one burst
    _steady(pace, last + 1.0, 5.0, 40)  # a 1 s checkpoint save, then steady again
    assert pace.usual_s() == pytest.approx(1.0)  # the quiet gap, not 30 s since the burst began
    assert Watchdog(pace, cap=DEFAULT_SILENCE).threshold() == FLOOR


def test_the_threshold_stays_the_quiet_gap_s_when_bursts_last():
    """Bursts of 3 s (a step's long output) every 10 s: the quiet between them is 7 s."""
    pace = Pace()
    for k in range(6):
        _steady(pace, 10.0 * k, 3.0, 40)
    assert pace.usual_s() == pytest.approx(7.0 + 1 / 40, abs=0.01)


@pytest.mark.timeout(150)
def test_a_pause_then_two_rotations_5s_apart_lose_nothing(make_simcluster, tmp_path):
    """The issue's stream on this simulator: 20 steps/s (~130 lines/s, a step every 50 ms:
    one endless burst), a 1 s pause at step 200, then two rotations 5 s apart. Today the
    threshold after the pause is 1.5 x 10 s and the second rotation takes ~100 steps."""
    steps = 420
    sim = make_simcluster(scenario(
        {"action": "stall", "at_step": 200, "seconds": 1.0},
        {"action": "rotate", "at_step": 260}, {"action": "rotate", "at_step": 360},
        rate=20, jobsets=[{"name": "olmo3-sft", "hosts": 1,
                           "trainer": {"steps": steps, "checkpoint_period": 1000}}]))
    db = str(tmp_path / "s.db")
    follow_sim(sim, db, silence=DEFAULT_SILENCE, timeout=90)
    r = assert_exactly_once(sim, db, "r")
    assert len(r["got"]) == steps, f"lost {sorted(set(range(1, steps + 1)) - {s for _, s in r['got']})}"
    assert not [k for k, _ in findings(db, "r") if k in ("gap", "head_gap")]
    assert dict(reconnects(db, "r")).get("silence", 0) >= 2  # both hangs were noticed
