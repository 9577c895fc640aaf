"""`steptail follow` as a process: refusing to start without an account, SIGTERM (flush,
commit, Parquet, no kubectl left) and SIGKILL mid-run then restart (no loss, no duplicate)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa
from test_follow_support import assert_exactly_once, kubectl_procs, recorded, scenario

pytestmark = pytest.mark.timeout(120)
CLI = [sys.executable, "-c", "from steptail.cli import main; main()"]


def _env(account: str | None) -> dict:
    env = dict(os.environ)
    env.pop("CLOUDSDK_CORE_ACCOUNT", None)
    if account:
        env["CLOUDSDK_CORE_ACCOUNT"] = account
    return env


_STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_collector_outlives_a_test():
    """A failing assertion must not leave a collector (and its kubectl) running."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _follow(sim, db: str, *extra: str) -> subprocess.Popen:
    args = [*CLI, "follow", "--jobset", "olmo3-sft", "--run", "r", "-n", "default", "--kubeconfig",
            str(sim.kubeconfig_path), "--db", db, "--silence", "1", "--no-view", *extra]
    proc = subprocess.Popen(args, env=_env(sim.account), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    _STARTED.append(proc)
    return proc


def _wait_rows(db: str, n: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        if os.path.exists(db):
            try:
                if len(recorded(db, "r")) >= n:
                    return
            except Exception:  # noqa: BLE001 - schema not there yet
                pass
        time.sleep(0.1)
    raise TimeoutError(f"fewer than {n} rows within {timeout}s")


def _wait_no_kubectl(marker: str, timeout: float = 10.0) -> list:
    deadline = time.monotonic() + timeout
    while (left := kubectl_procs(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_refuses_to_start_without_an_account(tmp_path):
    db = tmp_path / "x.db"
    r = subprocess.run([*CLI, "follow", "--jobset", "a", "--db", str(db)], env=_env(None),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "CLOUDSDK_CORE_ACCOUNT" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not db.exists()
    r = subprocess.run([*CLI, "follow", "--jobset", "a", "--jobset", "b", "--run", "x", "--account", "a@b"],
                       env=_env(None), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--run needs exactly one --jobset" in r.stderr


def test_sigterm_commits_everything_then_sigkill_and_restart_lose_nothing(make_simcluster, tmp_path):
    from steptail.storage.parquet import read_table

    sim = make_simcluster(scenario({"action": "eof_streams", "at_step": 300}, rate=40,
                                   jobsets=[{"name": "olmo3-sft", "hosts": 2,
                                             "trainer": {"steps": 500, "checkpoint_period": 50}}]))
    db, pq = str(tmp_path / "f.db"), str(tmp_path / "pq")
    marker = str(sim.kubeconfig_path)

    # 1. SIGTERM: clean shutdown, every committed row also in Parquet, no kubectl left
    proc = _follow(sim, db, "--parquet", pq)
    _wait_rows(db, 40, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert not _wait_no_kubectl(marker)
    sql = sorted(recorded(db, "r"))
    lp = read_table(pq, "loss_parts", "r").to_pydict()
    assert sorted(zip(lp["incarnation"], lp["step"], strict=True)) == sql

    # 2. restart, then SIGKILL mid-run (before its first Parquet flush): kubectl dies with it
    proc = _follow(sim, db, "--parquet", pq, "--parquet-every", "3600")
    _wait_rows(db, len(sql) + 60, proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    assert not _wait_no_kubectl(marker)

    # 3. restart until done: every step exactly once across the three collectors, in SQL and
    #    in Parquet (what the killed one committed but never flushed is caught up)
    proc = _follow(sim, db, "--until-done", "--json", "--parquet", pq)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    r = assert_exactly_once(sim, db, "r")
    assert len(r["got"]) == 500 and not r["gaps"]
    lp = read_table(pq, "loss_parts", "r").to_pydict()
    assert sorted(zip(lp["incarnation"], lp["step"], strict=True)) == sorted(recorded(db, "r"))
    assert not kubectl_procs(marker)
    from steptail.storage.db import open_store

    store = open_store(db)
    with store.engine.connect() as c:
        assert c.execute(sa.text("SELECT COUNT(*) FROM incarnations WHERE run='r'")).scalar() == 1
    store.dispose()
