"""Kubelet stamps that go back (issue 19, defect 5), against the real kubectl: stdout/stderr
interleaving (`stamp_skew`), a node clock stepping back (`clock_step`), and `sinceTime`
filtering each line as kubelet does once stamps are out of order."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from itertools import pairwise

import pytest
from test_sim_kubectl import TS, kubectl

from steptail.simcluster.kube import parse_rfc3339_ns, rfc3339

pytestmark = pytest.mark.timeout(60)


def scenario(steps: int, rate: float, faults: list[dict]) -> dict:
    return {"rate": rate, "grace_seconds": 3, "restart_pending_seconds": 0.3,
            "jobsets": [{"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": steps}}], "faults": faults}


def stamped(sim, *args) -> list[tuple[int, str]]:
    """(stamp ns, text) of every line kubectl prints with --timestamps."""
    r = kubectl(sim, "logs", sim.process0(), "--timestamps", *args)
    assert r.returncode == 0, r.stderr
    out = []
    for ln in r.stdout.splitlines():
        m = TS.match(ln)
        assert m, ln
        out.append((parse_rfc3339_ns(m.group(1)), m.group(2)))
    return out


def loss_step(text: str) -> int | None:
    return int(text.split("LOSS-PARTS step=", 1)[1].split()[0]) if "LOSS-PARTS step=" in text else None


def test_stamp_skew_stamps_loss_parts_before_the_line_before_it(make_simcluster):
    # from step 2 on (the fault fires after step 1), 100 steps, every 20th: steps 21, 41, 61, 81, 101
    sim = make_simcluster(scenario(130, 100, [
        {"at_step": 1, "action": "stamp_skew", "micros": 1, "every": 20, "steps": 100}]))
    sim.wait_done(timeout=20)
    lines = stamped(sim)
    back = {}
    for (prev_ns, _), (ns, text) in pairwise(lines):
        if ns < prev_ns:
            back[loss_step(text)] = prev_ns - ns
    assert back == {21: 1000, 41: 1000, 61: 1000, 81: 1000, 101: 1000}
    # the truth knows the write order and the stamps: the skewed lines are the only inversions
    journal = sim.truth.servable()
    assert [ln.seq for ln in journal] == sorted(ln.seq for ln in journal)
    inverted = [ln.step for a, ln in pairwise(journal) if ln.stamp_ns < a.stamp_ns]
    assert inverted == [21, 41, 61, 81, 101]


def test_stamp_skew_every_step_rest_of_run(make_simcluster):
    sim = make_simcluster(scenario(60, 100, [{"at": 0, "action": "stamp_skew", "micros": 5}]))
    sim.wait_done(timeout=20)
    lines = stamped(sim)
    for (prev_ns, _), (ns, text) in pairwise(lines):
        if loss_step(text) is not None:
            assert prev_ns - ns == 5000, text
        else:
            assert ns >= prev_ns, text  # the other lines still in order


def test_clock_step_back_and_since_time_filters_each_line(make_simcluster):
    # 20 steps/s; after step 60 (~3 s in) process 0's node clock steps back 2 s
    sim = make_simcluster(scenario(120, 20, [{"at_step": 60, "action": "clock_step", "seconds": -2}]))
    sim.wait_done(timeout=20)
    lines = stamped(sim)
    steps = [(loss_step(t), ns) for ns, t in lines if loss_step(t) is not None]
    assert [s for s, _ in steps] == list(range(1, 121))
    by_step = dict(steps)
    jump = by_step[61] - by_step[60]
    assert -2.1e9 < jump < -1.9e9  # one step back, by the clock's step (plus 50 ms of a step)
    assert all(b[1] > a[1] for a, b in pairwise(steps) if b[0] != 61)
    # absl prefixes follow the node clock too (the process reads the same clock)
    for step in (60, 61):
        stamp_ns, text = next((ns, t) for ns, t in lines if loss_step(t) == step)
        printed = datetime.strptime(f"{datetime.now(UTC).year}{text[1:21]}", "%Y%m%d %H:%M:%S.%f")
        assert abs(printed.replace(tzinfo=UTC).timestamp() - stamp_ns / 1e9) < 0.1, text

    # kubectl --since-time (whole seconds) between the stepped-back stamps and the stamps before
    # the step: kubelet skips each older line, so the head, then steps up to 60, then nothing
    # until the stepped clock passed `since` again
    since_ns = math.ceil((by_step[60] - 1e9) / 1e9) * 10**9
    assert by_step[61] < since_ns <= by_step[60]
    out = stamped(sim, f"--since-time={rfc3339(since_ns)}")
    expect = [(ns, t) for ns, t in lines if ns >= since_ns]
    assert out == expect
    got_steps = [loss_step(t) for _, t in out if loss_step(t) is not None]
    assert 60 in got_steps and 61 not in got_steps and 120 in got_steps
    assert got_steps != list(range(got_steps[0], 121))  # not a suffix: no seek to the first match

    # tailLines and limitBytes count lines and bytes, whatever the stamps
    assert stamped(sim, "--tail=200") == lines[-200:]
    r = kubectl(sim, "logs", sim.process0(), "--timestamps", "--limit-bytes=5000")
    full = kubectl(sim, "logs", sim.process0(), "--timestamps").stdout
    assert r.stdout == full[:5000]
    # sinceSeconds is taken on the node's (stepped) clock
    assert stamped(sim, "--since=1h") == lines


def test_clock_step_survives_container_restart_not_jobset_restart(make_simcluster):
    sim = make_simcluster(scenario(400, 50, [
        {"at_step": 20, "action": "clock_step", "seconds": -3601},
        {"at_step": 40, "action": "restart_container"},
        {"at_step": 80, "action": "restart_jobset", "grace_seconds": 5}]))
    sim.wait_step(100, incarnation=3, timeout=20)
    with sim.lock:
        truths = list(sim.truth())
    by = {(t.incarnation, t.step): parse_rfc3339_ns(t.timestamp) for t in truths}
    assert by[(1, 20)] - by[(1, 21)] > 3600e9  # stepped back an hour
    assert by[(2, 41)] < by[(1, 20)] - 3500e9  # same node after the in-place restart
    assert by[(3, 51)] > by[(1, 20)]  # new pods, new nodes: true time again
