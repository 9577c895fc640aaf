"""Goodput of a followed run: what only the cluster shows (each container's start) splits a
restart's recovery into the wait with no container running (`queued_s`), the start-up and the
compilation, and starts the run's wall time (docs/goodput.md)."""

from __future__ import annotations

import pytest
from test_follow_support import follow_sim, scenario

from steptail.storage.db import open_store
from steptail.storage.goodput import recompute_on, run_goodput

NS = 1e9


def _container_starts(sim) -> dict[int, int]:
    """Each incarnation's container start as the simulated kubelet reports it (startedAt:
    whole seconds), from the simulator's truth of which container wrote its steps."""
    with sim.lock:
        index = sim.state.truth_index["olmo3-sft"]
        return {inc: inst.started_ns // 10**9 * 10**9 for (inc, _), _, inst, _ in index}


@pytest.mark.timeout(150)
def test_a_restart_s_wait_is_from_the_old_last_line_to_the_new_container_s_start(
        make_simcluster, db_url, monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")
    sim = make_simcluster(scenario({"action": "restart_jobset", "at_step": 100}, restart_pending_seconds=2.5))
    follow_sim(sim, db_url)
    starts = _container_starts(sim)
    store = open_store(db_url)
    try:
        got = run_goodput(store, "r")
        with store.engine.connect() as conn:
            incs = conn.exec_driver_sql(
                "SELECT incarnation, pod, container_started_ns FROM incarnations WHERE run = 'r'"
                " ORDER BY incarnation").fetchall()
            last_old = conn.exec_driver_sql(
                "SELECT MAX(ts_ns) FROM loss_parts WHERE run = 'r' AND incarnation = 1").scalar()
            saves = conn.exec_driver_sql(
                "SELECT MAX(ts_ns) FROM checkpoints WHERE run = 'r' AND incarnation = 1 AND kind = 'save'").scalar()
            last_step = conn.exec_driver_sql("SELECT MAX(ts_ns) FROM loss_parts WHERE run = 'r'").scalar()
            full = recompute_on(conn, "r").report()
    finally:
        store.dispose()
    assert {n: c for n, _, c in incs} == starts  # what the kubelet said
    (restart,) = got["restarts"]
    last = max(t for t in (last_old, saves) if t is not None)
    assert restart["queued_s"] == pytest.approx(max(0.0, (incs[1][2] - last) / NS), abs=1e-6)
    assert restart["queued_s"] >= 1.5  # 2.5 s Pending; a container's start is whole seconds
    # the parts add up to the recovery: waiting, starting up, compiling
    parts = restart["queued_s"] + restart["startup_s"] + restart["compile_s"]
    assert parts == pytest.approx(restart["recovery_s"], abs=1e-6)
    assert got["wall_s"] == pytest.approx((last_step - incs[0][2]) / NS, abs=1e-6)  # from the container's start
    assert got == full  # kept at commit = recomputed from the rows
