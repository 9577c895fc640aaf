"""`follow -o ndjson` read by a consumer that stops reading: the follower goes on. A full pipe
used to block the write on the event loop, and with it every read and commit (found when a
test that never read the pipe saw its run freeze at ~110 steps, then called `unknown`). The
events wait in a bounded queue; past it they are dropped, counted and marked in the stream.
Real kubectl against the simulated cluster, and a real pipe."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
from sim_fixtures import make_simcluster  # noqa: F401

from steptail.event_stream import EventStream

pytestmark = pytest.mark.timeout(180)
CLI = [sys.executable, "-c", "from steptail.cli import main; main()"]


def test_a_blocked_reader_never_blocks_the_caller_and_drops_are_marked():
    gate, entered, written = threading.Event(), threading.Event(), []

    def write(event: dict) -> None:
        entered.set()
        gate.wait()  # the pipe is full until the reader reads again
        written.append(event)

    stream = EventStream(write, lambda: False, lambda: None, limit=10)
    stream.put({"event": "step", "step": 0})
    entered.wait(10)  # the writer holds it, blocked
    started = time.monotonic()
    for i in range(1, 25):
        stream.put({"event": "step", "step": i})
    assert time.monotonic() - started < 5  # no put waited on the reader (a generous bound: it never blocks)
    stream.put({"event": "step", "step": 99})  # still full: dropped too
    gate.set()
    while len(written) < 10:
        time.sleep(0.01)
    stream.put({"event": "step", "step": 100})  # room again: the mark, then the event
    stream.close()
    steps = [e.get("step") for e in written]
    # one in the writer's hands, 10 held, 14 + 1 dropped
    assert steps[:11] == list(range(11)), steps
    assert written[11] == {"event": "dropped", "events": 15,
                           "reason": "stdout was not read fast enough; the store holds every row"}
    assert steps[12:] == [100] and stream.dropped == 15


def _committed(db: str) -> int:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)) as conn:
            return conn.execute("SELECT COUNT(*) FROM loss_parts").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_follow_goes_on_while_its_ndjson_reader_does_not_read(make_simcluster, tmp_path):  # noqa: F811
    """No one reads the pipe while 400 steps are committed (a 64 KiB pipe holds ~110 steps'
    events: the old follower froze there); then the reader reads it all, in order."""
    sim = make_simcluster({"rate": 40, "jobsets": [{"name": "olmo3-sft", "hosts": 1,
                                                      "trainer": {"steps": 400, "checkpoint_period": 100}}]})
    db = str(tmp_path / "e.db")
    read_end, write_end = os.pipe()
    env = {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"} | {"CLOUDSDK_CORE_ACCOUNT": sim.account}
    with open(tmp_path / "err.log", "w+") as err:
        proc = subprocess.Popen([*CLI, "follow", "--jobset", "olmo3-sft", "-n", "default", "--kubeconfig",
                                 str(sim.kubeconfig_path), "--db", db, "--no-view", "--until-done", "-o", "ndjson"],
                                stdout=write_end, stderr=err, env=env)
        os.close(write_end)
        try:
            deadline = time.monotonic() + 120
            while _committed(db) < 400 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.5)
            committed = _committed(db)
            with os.fdopen(read_end, "rb") as out:  # the reader comes back: everything is there
                lines = out.read().decode().splitlines()
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        err.seek(0)
        log = err.read()
    assert committed == 400, (committed, log[-3000:])
    events = [json.loads(line) for line in lines if line.strip()]
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(1, 401))
    assert not [e for e in events if e["event"] == "dropped"]  # 800 events: under the bound
    assert proc.returncode == 0, log[-3000:]
