"""Issue 19, defect 7: no stall for time the follower itself was not running (SIGSTOP) or
spent recovering a hung stream; a trainer that really stalls is still flagged, once.

Real kubectl against the simulated cluster; the trainer's truth is its own schedule: it
stalls only where the scenario says so."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from test_follow_support import assert_exactly_once, findings, follow_sim, scenario

from steptail.runs.detect import Settings

pytestmark = pytest.mark.timeout(150)
CLI = [sys.executable, "-c", "from steptail.cli import main; main()"]
# 20 steps/s (median step 0.05 s) and k=20: a stall is over 1 s without a step, above a busy
# machine's jitter and below the watchdog's 2 s of a hang; the process test, k=40 (2 s)
RATE, STALL_K = 20, 20.0


@pytest.fixture(autouse=True)
def _account_env(monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")


def _stalls(db: str) -> list[str]:
    return [detail for kind, detail in findings(db, "r") if kind == "stall"]


def test_a_recovered_rotation_hang_is_not_a_stall(make_simcluster, tmp_path):
    """The stream hangs on a rotated file for the watchdog's 2 s (the trainer goes on): no stall.
    The trainer's own 4 s stall later is one."""
    sim = make_simcluster(scenario({"action": "rotate", "at_step": 60},
                                   {"action": "stall", "at_step": 150, "seconds": 4.0},
                                   rate=RATE, jobsets=[{"name": "olmo3-sft", "hosts": 2,
                                                        "trainer": {"steps": 200, "checkpoint_period": 50}}]))
    db = str(tmp_path / "s.db")
    sup = follow_sim(sim, db, silence=30.0, settings=Settings(stall_k=STALL_K), timeout=90)
    r = assert_exactly_once(sim, db, "r")
    assert len(r["got"]) == 200 and not r["lost"]
    assert sup.status["r"].reconnects >= 1  # the hang happened and was recovered
    details = _stalls(db)
    assert len(details) == 1 and "after step 150" in details[0], details
    assert [f.first_step for f in sup.detectors["r"].flagged if f.kind == "stall"] == [151]


def _committed_steps(db: str) -> int:
    """LOSS-PARTS rows committed so far, read-only: polling through open_store could create
    the file or wait on the follower's write lock (its busy timeout is 30 s) until the run is over."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)) as conn:
            return conn.execute("SELECT COUNT(*) FROM loss_parts WHERE run = 'r'").fetchone()[0]
    except sqlite3.Error:  # no file or no schema yet
        return 0


def _follow(sim, db: str, *extra: str, stall_k: float = 2 * STALL_K) -> subprocess.Popen:
    env = dict(os.environ, CLOUDSDK_CORE_ACCOUNT=sim.account)
    args = [*CLI, "follow", "--jobset", "olmo3-sft", "--run", "r", "-n", "default", "--kubeconfig",
            str(sim.kubeconfig_path), "--db", db, "--no-view", "--stall-k", str(stall_k), *extra]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_stopped_collector_raises_no_stall(make_simcluster, tmp_path):
    """SIGSTOP for 6 s, then SIGCONT: the trainer never stopped (its stamps say so), so no
    stall; the collector logs that it was not running. A true 5 s stall later is flagged."""
    sim = make_simcluster(scenario({"action": "stall", "at_step": 250, "seconds": 5.0},
                                   rate=RATE, jobsets=[{"name": "olmo3-sft", "hosts": 2,
                                                        "trainer": {"steps": 300, "checkpoint_period": 50}}]))
    db = str(tmp_path / "s.db")
    proc = _follow(sim, db, "--until-done")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            if _committed_steps(db) >= 60:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(6.0)
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    r = assert_exactly_once(sim, db, "r")
    assert len(r["got"]) == 300 and not r["lost"]
    assert "was not running for" in err, err[-2000:]
    details = _stalls(db)
    assert len(details) == 1 and "after step 250" in details[0], details
