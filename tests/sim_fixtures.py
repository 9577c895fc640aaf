"""Pytest fixtures for the simulated cluster. Use from a test module or conftest with
`from sim_fixtures import simcluster, make_simcluster  # noqa: F401` (tests/ is on pytest's pythonpath).

- ``simcluster``: a running simulator (one 4-host JobSet `olmo3-sft`, 50 steps/s, 300 steps,
  checkpoint every 50, small grace/pending times); stopped after the test.
- ``make_simcluster``: factory ``make_simcluster(scenario_dict)`` for custom scenarios.
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager

import pytest

from steptail.simcluster.cluster import SimCluster

FAST = {
    "namespace": "default",
    "rate": 50,
    "grace_seconds": 3,
    "restart_pending_seconds": 0.3,
    "jobsets": [{"name": "olmo3-sft", "hosts": 4, "trainer": {"steps": 300, "checkpoint_period": 50}}],
}


@pytest.fixture
def make_simcluster(tmp_path):
    started: list[SimCluster] = []

    def make(scenario: dict | None = None, **kw) -> SimCluster:
        sim = SimCluster(scenario if scenario is not None else FAST,
                         state_dir=tmp_path / f"sim{len(started)}", **kw)
        sim.start_in_thread()
        started.append(sim)
        return sim

    yield make
    for sim in started:
        sim.stop_thread()


@pytest.fixture
def simcluster(make_simcluster) -> SimCluster:
    return make_simcluster()


@contextmanager
def simcluster_subprocess(scenario_path: str | None = None, timeout: float = 20.0):
    """Run `steptail simcluster` as a subprocess; yields (proc, kubeconfig_path)."""
    import tempfile
    import time

    with tempfile.TemporaryDirectory() as d:
        kc = os.path.join(d, "kubeconfig")
        args = [sys.executable, "-c", "from steptail.cli import main; main()", "simcluster",
                "--kubeconfig-out", kc]
        if scenario_path:
            args += ["--scenario", scenario_path]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + timeout
            while not os.path.exists(kc):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"simcluster did not start: {proc.stderr.read() if proc.stderr else ''}")
                time.sleep(0.05)
            yield proc, kc
        finally:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
