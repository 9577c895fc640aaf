"""A pod list answer of many MB from a server that ignores `limit` (issue 34, row 8): refused
past discovery.MAX_PAGE_BYTES before it is parsed, as a discovery failure with one line that
says why, the collector's memory bounded. Before, a 55 MB answer was parsed whole: 700 MB
resident and the event loop stalled 10 s. Real kubernetes client against the simulator
(simcluster/hostile.py `ignore_limit`); both stores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from sim_fixtures import make_simcluster  # noqa: F401
from store_fixtures import db_url  # noqa: F401
from test_follow_support import FAST

from steptail.collector.cluster.discovery import MAX_PAGE_BYTES

pytestmark = pytest.mark.timeout(240)
CLI = [sys.executable, "-c", "from steptail.cli import main; main()"]
FLOOD = 40_000  # ~650 bytes a pod: a ~26 MB answer
PEAK_BOUND_KB = 350 << 10  # follow alone ~240 MB here; the 26 MB answer parsed whole took far more


def follow_measured(sim, db: str, tmp_path, *extra: str) -> tuple[int, str, str, int]:
    """(exit code, stdout, stderr, peak resident KB) of a follow run: its own VmHWM (the
    kernel's high-water mark of its resident set), read until it exits."""
    env = {k: v for k, v in os.environ.items() if k not in ("STEPTAIL_DB", "CLOUDSDK_CORE_ACCOUNT")}
    env["CLOUDSDK_CORE_ACCOUNT"] = sim.account
    out, err = tmp_path / "out", tmp_path / "err"
    peak = 0
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen([*CLI, "follow", "-n", "default", "--kubeconfig", str(sim.kubeconfig_path),
                                 "--db", db, "--silence", "1", "--no-view", "--json", *extra],
                                stdout=o, stderr=e, env=env)
        while proc.poll() is None:
            try:
                with open(f"/proc/{proc.pid}/status") as status:
                    peak = max([peak] + [int(ln.split()[1]) for ln in status if ln.startswith("VmHWM:")])
            except (OSError, ValueError, IndexError):  # exiting meanwhile
                pass
            time.sleep(0.05)
    return proc.returncode, out.read_text(), err.read_text(), peak


def test_a_pod_list_ignoring_limit_is_refused_before_it_is_parsed(make_simcluster, db_url, tmp_path):  # noqa: F811
    sim = make_simcluster({**FAST, "jobsets": [{"name": "olmo3-sft", "hosts": 1, "trainer": {"steps": 6000}}]})
    sim.api.hostile.flood, sim.api.hostile.ignore_limit = FLOOD, True
    body = len(json.dumps(sim.api.hostile.listed([], lambda p: True, "default")))
    assert body > MAX_PAGE_BYTES  # the answer is past the bound
    code, out, err, peak_kb = follow_measured(sim, db_url, tmp_path, "--all", "--duration", "15")
    assert code == 0, err[-3000:]
    failing = [ln for ln in err.splitlines() if "discovery failing" in ln]
    assert failing and "ignores `limit`" in failing[0] and "refused, not parsed" in failing[0], err[-3000:]
    assert "Traceback" not in err
    assert json.loads(out)["runs"] == []  # nothing listed, nothing followed: said, not guessed
    assert peak_kb < PEAK_BOUND_KB, peak_kb
    assert sim.api.hostile.pages == 0  # every answer was whole: `limit` ignored
