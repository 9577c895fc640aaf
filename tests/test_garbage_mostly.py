"""A process-0 stream of random bytes (issue 34, row 5): random bytes cut at their newlines give
"lines" of which ~0.7 % are short valid UTF-8, and such a line used to end the unreadable spell,
so 20 MB of garbage said nothing. Now a window mostly unreadable is the failure (a warning line
when it starts and when it clears, the collector event, the errors metric), however many short
readable fragments come between. Real kubectl against the simulated cluster; both stores."""

from __future__ import annotations

import logging
import random
import threading
import time

import pytest
from sim_fixtures import make_simcluster  # noqa: F401
from store_fixtures import db_url  # noqa: F401
from test_follow_support import (
    assert_exactly_once,
    collector_events,
    findings,
    follow_sim,
    scenario,
)

from steptail.collector.live.stream_lines import readable

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(autouse=True)
def _account_env(monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")


def random_lines(rnd: random.Random, size: int) -> list[str]:
    """`size` random bytes cut at their newlines, as the simulator's write_lines takes them."""
    return [chunk.decode("utf-8", "surrogateescape") for chunk in rnd.randbytes(size).split(b"\n")]


def test_random_bytes_hold_readable_fragments():
    lines = [t.encode("utf-8", "surrogateescape") for t in random_lines(random.Random(7), 1 << 20)]
    fragments = [ln for ln in lines if readable(ln)]
    assert fragments and len(fragments) < len(lines) // 20  # a few, short: they used to end every spell


def test_random_bytes_with_readable_fragments_are_said(make_simcluster, db_url, caplog):  # noqa: F811
    sim = make_simcluster(scenario({"action": "stall", "at_step": 60, "seconds": 8.0}, rate=20))
    caplog.set_level(logging.INFO, logger="steptail")
    written = []

    def garbage():  # while the trainer is quiet: random bytes, with a readable fragment every few lines
        sim.wait_step(60, timeout=60)
        rnd = random.Random(3)
        for _ in range(60):
            lines = random_lines(rnd, 8 << 10) + ["ok", "é"]
            rnd.shuffle(lines)
            sim.write_lines(None, lines)
            written.extend(lines)
            time.sleep(0.1)

    t = threading.Thread(target=garbage, daemon=True)
    t.start()
    follow_sim(sim, db_url, unreadable_after=2.0, timeout=120)
    t.join(10)
    assert sum(readable(x.encode("utf-8", "surrogateescape")) for x in written) >= 120  # many fragments
    r = assert_exactly_once(sim, db_url, "r")
    assert len(r["got"]) == 160 and not r["gaps"]
    said = [rec.getMessage() for rec in caplog.records if "stream content" in rec.getMessage()]
    assert said and "failing (unreadable): process 0 prints nothing steptail can read" in said[0], said
    assert "ok again" in said[-1], said
    flagged = [(k, d) for k, d in findings(db_url, "r") if "nothing steptail can read" in d]
    assert flagged and {k for k, _ in flagged} == {"unreadable_log"}, flagged  # a finding, not only a line
    found = [e for e in collector_events(db_url, "r") if "nothing steptail can read" in e["reason"]]
    assert found and found[0]["kind"] == "stream_failure" and found[0]["cleared"], found
