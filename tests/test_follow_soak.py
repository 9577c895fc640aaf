"""Soak: several JobSets followed with `--all`, faults mixed across them (rotation hangs,
lines rotated away, EOFs, JobSet and container restarts, an auth lapse, server errors).
Per run: every written step recorded exactly once or inside a recorded stream gap."""

from __future__ import annotations

import pytest
from test_follow_support import FAST, assert_exactly_once, follow_sim, kubectl_procs

pytestmark = pytest.mark.timeout(120)

NAMES = ("soak-a", "soak-b", "soak-c", "soak-d")
SOAK = {
    **FAST,
    "rate": 40,
    "jobsets": [{"name": n, "hosts": 2, "trainer": {"steps": 240, "checkpoint_period": 40}} for n in NAMES]
    + [{"name": "other", "slices": 1, "hosts": 1, "replicated_job": "eval", "trainer": {"steps": 20}}],
    "faults": [
        {"action": "rotate", "jobset": "soak-a", "at_step": 40},
        {"action": "restart_jobset", "jobset": "soak-a", "at_step": 150},
        {"action": "rotate", "jobset": "soak-b", "at_step": 60},
        {"action": "rotate", "jobset": "soak-b", "at_step": 66},
        {"action": "restart_container", "jobset": "soak-b", "at_step": 170},
        {"action": "eof_streams", "at": 2.0},
        {"action": "auth_lapse", "at": 3.0, "seconds": 1.0},
        {"action": "eof_streams", "at": 3.1},
        {"action": "rotate", "jobset": "soak-c", "at_step": 120},
        {"action": "restart_jobset", "jobset": "soak-c", "at_step": 125},
        {"action": "fail_next", "at": 4.5, "n": 3, "code": 500, "path": "/log"},
        {"action": "eof_streams", "at": 4.6},
        {"action": "restart_jobset", "jobset": "soak-d", "at_step": 200},
    ],
}


def test_soak_mixed_faults_over_several_jobsets(make_simcluster, tmp_path, monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")
    sim = make_simcluster(SOAK)
    db = str(tmp_path / "soak.db")
    sup = follow_sim(sim, db, {}, follow_all=True, selector="jobset.sigs.k8s.io/replicatedjob-name=slice",
                     expect_runs=len(NAMES), timeout=90)
    assert set(sup.status) == set(NAMES)  # the selector kept the eval JobSet out
    lost_somewhere = 0
    for name in NAMES:
        r = assert_exactly_once(sim, db, name, name)
        lost_somewhere += len(r["lost"])
    assert lost_somewhere > 0  # soak-b's double rotation really lost lines (inside gaps)
    auth = [f for d in sup.detectors.values() for f in d.failures if f.kind == "auth"]
    assert auth and all(f.reason for f in auth)
    assert not kubectl_procs(str(sim.kubeconfig_path))
