"""The chaos harness's own failures (simcluster/chaos_run.py) say what happened: a follower
that never reaches the simulated cluster is reported with its last log lines and exit code,
and the sampler of a run that failed before it started stops cleanly (it once raised over
that error and ended a whole 96-seed benchmark)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from steptail.simcluster.chaos_run import Follower, Sampler, _wait_ready


def test_a_follower_that_exits_at_start_is_reported_with_its_log(tmp_path):
    f = Follower(0, [sys.executable, "-c", "import sys; print('store refused: boom', file=sys.stderr); sys.exit(3)"],
                 tmp_path / "follow-0.log", {})
    f.start()
    with pytest.raises(RuntimeError, match=r"follower 0 \(exit 3\): store refused: boom"):
        _wait_ready(SimpleNamespace(requests=[]), [f], timeout=30)


def test_a_follower_that_never_asks_times_out_with_its_log(tmp_path):
    f = Follower(0, [sys.executable, "-c", "import sys, time; print('waiting', file=sys.stderr, flush=True); "
                     "time.sleep(30)"], tmp_path / "follow-0.log", {})
    f.start()
    try:
        with pytest.raises(TimeoutError, match=r"in 2 s: follower 0 \(exit None\)"):
            _wait_ready(SimpleNamespace(requests=[]), [f], timeout=2)
    finally:
        f.kill()


def test_a_sampler_never_started_stops():
    Sampler("sqlite:///unused.db").stop()
