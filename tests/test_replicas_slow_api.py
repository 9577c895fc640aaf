"""Replicas handing runs over while the API is slow (issue 33): every answer of the simulated
cluster seconds late while a second replica joins (the first gives half its runs back) and
again while the first is killed (the second takes its runs over). Nothing may be lost or
recorded twice, and no pod may be followed by two replicas at once — on the real PostgreSQL,
with the real kubectl, each replica as its own account."""

from __future__ import annotations

import os
import signal
import time

from store_fixtures import PG_ADMIN
from test_follow_support import assert_exactly_once, gaps, recorded, stop_replicas
from test_replicas import account, follow_intervals, overlaps, start_replica

from steptail.storage.scratch import scratch_database

JOBSETS = 4
STEPS = 300
RATE = 10  # steps per second per JobSet: 30 s of training
SLOW = (6.0, 1.5)  # (seconds, each answer this late): longer than a round trip, shorter than the run


def scenario() -> dict:
    return {"namespace": "default", "rate": RATE, "grace_seconds": 3, "restart_pending_seconds": 0.3,
            "jobsets": [{"name": f"slow-{i}", "hosts": 1, "trainer": {"steps": STEPS, "checkpoint_period": 100}}
                        for i in range(JOBSETS)]}


def wait_for(predicate, seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def test_replicas_hand_over_while_the_api_is_slow(make_simcluster, tmp_path):
    sim = make_simcluster(scenario())
    with scratch_database(PG_ADMIN, "steptail_slow_handover") as db:
        procs = [start_replica(sim, db, 0, tmp_path)]
        try:
            # the first replica follows every run, then the API slows and a second one joins:
            # the handover of half the runs happens while every answer is late
            assert wait_for(lambda: all(len(recorded(db, f"slow-{i}")) >= 20 for i in range(JOBSETS)), 40)
            sim.slow_api(*SLOW)
            procs.append(start_replica(sim, db, 1, tmp_path))
            assert wait_for(lambda: any(u == account(1) for spans in follow_intervals(sim).values()
                                        for *_, u in spans), 30), "the second replica never took a run"
            # slow again, and the first replica dies: the second takes its runs over
            sim.slow_api(*SLOW)
            os.killpg(procs[0].pid, signal.SIGKILL)
            procs[0].wait(10)
            wait_for(lambda: all(len(recorded(db, f"slow-{i}")) >= STEPS for i in range(JOBSETS)), 90)
        finally:
            stop_replicas(procs)
        logs = {p.name: p.read_text()[-3000:] for p in tmp_path.glob("replica-*.log")}
        intervals = follow_intervals(sim)
        assert not overlaps(intervals), overlaps(intervals)[:5]
        for i in range(JOBSETS):
            run = f"slow-{i}"
            assert sorted(s for _, s in recorded(db, run)) == list(range(1, STEPS + 1)), (run, logs)
            assert_exactly_once(sim, db, run, run)
            assert gaps(db, run) == [], (run, logs)
