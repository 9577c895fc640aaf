"""Workload faults against the real kubectl and their truth: restarts whose start-up lines
were rotated away (`head_rotated`), process 0 deleted from a scenario, and the servable
intervals `sim.truth.servable()` gives the oracle (rotation, grace period, deletion)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import yaml
from test_sim_kubectl import LOSS, kubectl, wait_running

from steptail.simcluster.cluster import SimCluster
from steptail.simcluster.dbproxy import DbProxy

pytestmark = pytest.mark.timeout(60)

STARTUP = "Attempting to initialize the jax distributed system..."


def scenario(faults: list, steps: int = 3000, rate: float = 50, grace: float = 2) -> dict:
    return {"rate": rate, "grace_seconds": grace, "restart_pending_seconds": 0.3,
            "jobsets": [{"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": steps, "checkpoint_period": 20}}],
            "faults": faults}


def served_steps(text: str) -> list[int]:
    return [int(m.group(1)) for m in LOSS.finditer(text)]


def test_restart_jobset_head_rotated_before_anyone_could_read_it(make_simcluster):
    sim = make_simcluster(scenario([{"at_step": 30, "action": "restart_jobset", "head_rotated": 0}]))
    sim.wait_step(45, incarnation=2)
    p0 = sim.process0()
    r = kubectl(sim, "logs", p0)
    assert r.returncode == 0, r.stderr
    assert STARTUP not in r.stdout and "Restoring checkpoint" not in r.stdout
    steps = served_steps(r.stdout)
    assert steps[0] == 21 and steps == list(range(21, steps[-1] + 1))  # the steps are there, the head is not
    lines = [ln for ln in sim.truth.servable() if ln.pod == p0]
    head = [ln for ln in lines if ln.file_gen == 0]
    assert STARTUP in head[0].text and "Restoring checkpoint from step 20." in head[-1].text
    assert all("] " in ln.text and ln.step is None for ln in head)  # the start-up lines, no step
    for ln in head:  # rotated away in the tick that wrote it: servable for no time a reader could use
        [(frm, to)] = ln.intervals
        assert to is not None and 0 <= to - frm < 50e6 and not ln.served
        assert ln.incarnation == 2
    assert all(ln.intervals[0][1] is None for ln in lines if ln.step)


def test_restart_container_head_rotated_after_n_steps(make_simcluster):
    sim = make_simcluster(scenario([{"at_step": 30, "action": "restart_container", "head_rotated": 3}]))
    sim.wait_step(40, incarnation=2)
    p0 = sim.process0()
    r = kubectl(sim, "logs", p0)
    assert STARTUP not in r.stdout
    assert served_steps(r.stdout)[0] == 24  # restored from 20, steps 21-23 rotated away with the head
    prev = kubectl(sim, "logs", p0, "--previous")
    assert served_steps(prev.stdout) == list(range(1, 31))  # the old container is intact
    gone = [ln.step for ln in sim.truth.servable() if ln.kind == "loss" and ln.intervals[0][1] is not None]
    assert gone == [21, 22, 23]


def test_delete_pod_scenario_deletes_process0_and_ends_its_lines(make_simcluster):
    sim = make_simcluster(scenario([{"at_step": 10, "action": "delete_pod", "grace_seconds": 0.5}]))
    wait_running(sim)
    p0 = sim.process0()
    sim.wait_step(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and sim.process0() == p0:
        time.sleep(0.02)
    assert kubectl(sim, "get", "pod", p0).returncode == 1  # gone: 404
    lines = sim.truth.servable()
    ends = {ln.intervals[0][1] for ln in lines}
    assert len(ends) == 1 and None not in ends  # every line ended when the pod went
    [end] = ends
    assert max(ln.wall_ns for ln in lines) + 0.5e9 <= end + 10e6  # after the grace period
    assert max(ln.step or 0 for ln in lines) == 10


def test_servable_intervals_follow_rotation_and_grace(make_simcluster):
    sim = make_simcluster(scenario([{"at_step": 10, "action": "rotate"},
                                    {"at_step": 25, "action": "restart_jobset", "grace_seconds": 1.5}]))
    sim.wait_step(140, incarnation=2)  # 2.4 s after the restart: the grace period is over
    by = {}
    for ln in sim.truth.servable():
        if ln.kind == "loss":
            by[(ln.incarnation, ln.step)] = ln
    rot_end = by[(1, 1)].intervals[0][1]
    assert all(by[(1, s)].intervals[0][1] == rot_end for s in range(1, 11))  # the first file rotated
    del_end = by[(1, 11)].intervals[0][1]
    assert del_end is not None and del_end > rot_end
    assert all(by[(1, s)].intervals[0][1] == del_end for s in range(11, 26))  # the old pod deleted
    assert del_end - by[(1, 25)].wall_ns >= 1.5e9  # ... after its grace period
    assert all(by[(2, s)].intervals == [(by[(2, s)].wall_ns, None)] for s in range(21, 41))
    assert by[(2, 21)].restart_count == 0 and by[(2, 21)].pod != by[(1, 21)].pod


def test_faults_are_checked_at_construction_and_recorded_when_applied(make_simcluster):
    with pytest.raises(ValueError, match="secnds"):
        SimCluster(scenario([{"at": 0, "action": "stall", "secnds": 3}]))
    with pytest.raises(ValueError, match="db_proxy"):
        SimCluster(scenario([{"at": 0, "action": "db_outage", "seconds": 3}]))
    sim = make_simcluster(scenario([{"at_step": 5, "action": "delete_pod", "pod": "no-such-pod"},
                                    {"at_step": 6, "action": "stall", "seconds": 0.2},
                                    {"at": 0.0, "action": "auth_lapse", "seconds": 0.1}], steps=40))
    sim.wait_done(timeout=20)  # a fault that failed did not stop the run
    got = sim.truth.faults()
    assert [(f.action, f.at, f.at_step) for f in got] == [("auth_lapse", 0.0, None), ("delete_pod", None, 5),
                                                         ("stall", None, 6)]
    assert got[1].error.startswith("KeyError") and got[0].error is None and got[2].error is None
    assert got[0].wall_ns < got[1].wall_ns < got[2].wall_ns


def test_the_documented_scenario_example_is_valid():
    """docs/simcluster.md's scenario file: every fault in it fits its action's parameters."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "simcluster.md").read_text()
    sc = yaml.safe_load(re.search(r"```yaml\n(namespace: default.*?)```", doc, re.S).group(1))
    assert {f["action"] for f in sc["faults"]} >= {"stamp_skew", "clock_step", "db_outage", "slow_api",
                                                   "hang_api", "watch_gone"}
    SimCluster(sc, db_proxy=DbProxy())  # not started: construction checks the faults
