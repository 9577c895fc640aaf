"""Chaos seeds 102 and 110 (issue 19, defect 1 in discovery): failures of pod lists as
`follow` starts must not make discovery wait past the pods. Its list/watch retries follow the
follower's rule (collector.notify.health.Backoff): doubling per kind of failure, from the start again
when the kind changes or after a success, capped; a watch's 410 Gone relists at once.

Real kubectl against the simulated cluster, checked against the simulator's truth."""

from __future__ import annotations

import pytest
from test_follow_support import assert_exactly_once, findings, follow_sim, scenario

from steptail.collector.cluster.discovery import BACKOFF_MAX
from steptail.collector.notify.health import Backoff

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _account_env(monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")


def test_the_retry_rule_is_per_kind_reset_by_a_success_and_capped():
    b = Backoff()
    waits = []
    for kind in ["server_error"] * 3 + ["forbidden"] * 2 + ["server_error"] * 6:
        b.fail(kind)
        waits.append(b.delay(BACKOFF_MAX))
    assert waits == [0.25, 0.5, 0.5, 0.25, 0.5, 0.25, 0.5, 0.5, 0.5, 0.5, 0.5]
    b.ok()
    assert b.delay(BACKOFF_MAX) == 0.0
    b.fail("server_error")
    assert b.delay(BACKOFF_MAX) == 0.25


def test_a_burst_of_six_5xx_is_retried_through_well_inside_the_servable_window():
    """Chaos seed 111: six 500s on the first pod lists, retried 0.25+0.5+1+2+2+2 = 7.75 s with
    a 2 s cap, kept the first read of process 0 past the rotation of its log file. Six is
    the longest burst the chaos draws; the oracle wants a step readable for 5 s recorded."""
    from steptail.simcluster.oracle import SERVABLE_SECONDS

    b = Backoff()
    waited = 0.0
    for _ in range(6):
        b.fail("server_error")
        waited += b.delay(BACKOFF_MAX)
    assert waited == 2.75 < SERVABLE_SECONDS - 2  # room left for the list and the first log read


def test_six_pod_list_500s_as_follow_starts_read_the_head_before_it_rotates(make_simcluster, tmp_path):
    """Chaos seed 111 without its timing luck: six 500s queued on /pods before the collector's
    first request, the log rotated at step 100 (~5 s in, 20 steps/s). Listed after 2.75 s of
    retries the pod is read from step 1, before the rotation, and every step is recorded once;
    with the 2 s cap (7.75 s) steps 1-100 were in the rotated file when it was first read."""
    sim = make_simcluster(scenario({"action": "rotate", "at_step": 100}, rate=20))
    sim.fail_next(6, code=500, path="/pods")
    db = str(tmp_path / "s.db")
    sup = follow_sim(sim, db, timeout=100)
    r = assert_exactly_once(sim, db, "r")
    assert r["got"] == {(1, s) for s in range(1, 161)}
    assert not r["lost"]
    assert not [k for k, _ in findings(db, "r") if k in ("gap", "head_gap")]  # the head was read
    assert sup.discovery.health.counts == {"server_error": 6}


def test_pod_list_failures_of_several_kinds_as_follow_starts_lose_no_pod(make_simcluster, tmp_path):
    """503 x3, 403 x3, 503 x3 on the first pod lists, then a JobSet restart with a 1 s grace
    10 s in. Waits carried over from kind to kind (0.2 … 5 s: 26 s before the first list)
    let the first pod go unread; per kind (0.25+0.5+0.5 s three times) it is listed in ~4 s and
    every step of both pods is recorded."""
    sim = make_simcluster(scenario(
        {"action": "restart_jobset", "at_step": 200, "grace_seconds": 1.0},
        rate=20, jobsets=[{"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": 400, "checkpoint_period": 50}}]))
    for code in (503, 403, 503):  # queued before the collector's first request: its lists get them
        sim.fail_next(3, code=code, path="/pods")
    db = str(tmp_path / "s.db")
    sup = follow_sim(sim, db, timeout=100)
    r = assert_exactly_once(sim, db, "r")
    assert {(1, s) for s in range(1, 201)} <= r["got"]  # the first pod, read before its deletion
    assert {(2, s) for s in range(201, 401)} <= r["got"]
    assert not r["lost"]
    assert sup.discovery.health.counts == {"server_error": 6, "forbidden": 3}
