"""A collector that was down records what it could not read: the process-0 pod it was reading
was replaced and deleted meanwhile (a JobSet restart with a short grace period), so the lines
after its last read are gone — a stream gap and an `unread_tail` finding, not silence."""

from __future__ import annotations

import asyncio
import time

import pytest
from test_follow_support import (
    assert_exactly_once,
    findings,
    follow_sim,
    gaps,
    recorded,
    scenario,
)

from steptail.collector.cluster.kubectl import KubeTarget
from steptail.collector.live.follower import FollowConfig
from steptail.collector.live.supervisor import Plan, Supervisor
from steptail.storage.db import open_store

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _account_env(monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")


def _follow_until_step(sim, db: str, step: int, timeout: float = 30.0) -> None:
    """Follow until `step` is committed, then stop as a crash would leave it (no drain)."""
    store = open_store(db)
    target = KubeTarget(sim.scenario.namespace, sim.account, str(sim.kubeconfig_path))

    async def main() -> None:
        sup = Supervisor(store, Plan(target, {"olmo3-sft": "r"}, config=FollowConfig()))
        task = asyncio.create_task(sup.run(install_signals=False))
        deadline = time.monotonic() + timeout
        while not any(s for _, s in recorded(db, "r") if s >= step):
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.05)
        sup.stop()
        await task

    try:
        asyncio.run(main())
    finally:
        store.dispose()


def test_a_pod_deleted_while_the_collector_was_down_is_a_gap_and_a_finding(make_simcluster, tmp_path):
    sim = make_simcluster(scenario({"action": "restart_jobset", "at_step": 120, "grace_seconds": 1},
                                   rate=20, jobsets=[{"name": "olmo3-sft", "hosts": 1,
                                                      "trainer": {"steps": 200, "checkpoint_period": 50}}]))
    db = str(tmp_path / "s.db")
    _follow_until_step(sim, db, 60)
    first_pod = sim.process0()
    sim.wait_step(130, timeout=30)  # restarted meanwhile; the old pod's grace runs out
    deadline = time.monotonic() + 10
    while first_pod in sim.pod_names() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert first_pod not in sim.pod_names()

    follow_sim(sim, db, silence=FollowConfig().silence)
    r = assert_exactly_once(sim, db, "r")  # every lost step lies inside a recorded gap
    lost = sorted(s for i, s in {(t.incarnation, t.step) for t in r["truth"]} - r["got"] if i == 1)
    assert lost and lost[-1] == 120  # the old pod's tail, never read
    assert [reason for *_, reason in gaps(db, "r") if "collector was down" in reason]
    tails = [detail for kind, detail in findings(db, "r") if kind == "unread_tail"]
    assert len(tails) == 1 and first_pod in tails[0], findings(db, "r")


def test_a_restart_without_a_restart_of_the_jobset_records_no_gap(make_simcluster, tmp_path):
    """The control: the pod is still there, the collector reads on from its cursor."""
    sim = make_simcluster(scenario(rate=20, jobsets=[{"name": "olmo3-sft", "hosts": 1,
                                                      "trainer": {"steps": 150, "checkpoint_period": 50}}]))
    db = str(tmp_path / "s.db")
    _follow_until_step(sim, db, 40)
    follow_sim(sim, db, silence=FollowConfig().silence)
    r = assert_exactly_once(sim, db, "r")
    assert len(r["got"]) == 150 and not r["gaps"]
    assert not [k for k, _ in findings(db, "r") if k == "unread_tail"]


def test_a_stream_read_to_its_end_is_known_after_a_restart(store):
    """On SQLite and PostgreSQL: `done` is saved with the cursor and loaded back."""
    from steptail.runs.model import RunModel
    from steptail.storage.sql import SqlSink, load_model

    model = RunModel("r")
    for stream in ("u1/jax-tpu/0", "u2/jax-tpu/0"):
        model.feed(b"2026-11-30T04:00:00.5Z I1130 train.py:1] hello\n", stream=stream)
    model.finish_stream("u1/jax-tpu/0")
    sink = SqlSink(store)
    with store.engine.begin() as conn:
        sink.ensure_run(conn, "r")
        sink.write(conn, "r", model.take())
    with store.engine.connect() as conn:
        loaded = load_model(conn, "r")
    assert {k: c.done for k, c in loaded.cursors.items()} == {"u1/jax-tpu/0": True, "u2/jax-tpu/0": False}
