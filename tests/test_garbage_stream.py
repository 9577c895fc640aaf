"""Issue 20, item 6: a process-0 stream of binary garbage is not silent. While a stream
delivers bytes but no readable line for a while: one warning line when it starts and one when
it clears, the errors metric and the follower's up gauge, a warning finding of the run
(`unreadable_log`, "process 0 prints nothing steptail can read") and the summary; every step around it is still recorded exactly once.

Real kubectl against the simulated cluster (its `garbage` fault prints random bytes)."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from test_follow_support import (
    assert_exactly_once,
    collector_events,
    findings,
    follow_sim,
    scenario,
)

from steptail.collector.live.stream_lines import readable
from steptail.collector.notify.metrics import Metrics

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _account_env(monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")


def test_what_is_readable():
    assert readable(b"2026-11-30T04:12:33.3868Z I1130 train.py:12] LOSS-PARTS step=3 ce=1.0\n")
    assert readable("2026-11-30T04:12:33Z progress \x1b[32m██▌\x1b[0m 12%\r\n".encode())  # colours, bars
    assert not readable(b"2026-11-30T04:12:33Z \x00\x01binary\n")
    assert not readable(b"2026-11-30T04:12:33Z \xff\xfe latin-1 \xe9\n")


def test_a_garbage_stream_is_a_warning_a_metric_and_a_finding(make_simcluster, tmp_path, caplog):
    sim = make_simcluster(scenario({"action": "stall", "at_step": 60, "seconds": 6.0}, rate=20))
    caplog.set_level(logging.INFO, logger="steptail")

    def garbage():  # while the trainer is quiet, process 0 prints only garbage, for ~5 s
        sim.wait_step(60, timeout=60)
        for i in range(50):
            sim.garbage(lines=5, size=300, seed=i)
            time.sleep(0.1)

    t = threading.Thread(target=garbage, daemon=True)
    t.start()
    db, metrics = str(tmp_path / "s.db"), Metrics()
    sup = follow_sim(sim, db, metrics=metrics, unreadable_after=2.0, timeout=90)
    t.join(10)
    r = assert_exactly_once(sim, db, "r")
    assert len(r["got"]) == 160 and not r["gaps"]  # the garbage cost no step

    # the run's own output is unreadable: its data is in doubt, one warning finding (issue 34
    # row 5), and the stream's health a collector event (stored, cleared)
    said_by_run = [(k, d) for k, d in findings(db, "r") if "nothing steptail can read" in d]
    assert [k for k, _ in said_by_run] == ["unreadable_log"], said_by_run
    found = [e for e in collector_events(db, "r") if "nothing steptail can read" in e["reason"]]
    assert len(found) == 1 and found[0]["kind"] == "stream_failure", found
    assert found[0]["source"] == "stream content" and found[0]["cleared"] and not found[0]["lost_steps"], found
    said = [rec.getMessage() for rec in caplog.records if "stream content" in rec.getMessage()]
    assert len(said) == 2, said
    assert "failing (unreadable): process 0 prints nothing steptail can read" in said[0]
    assert "ok again" in said[1]
    st = sup.status["r"]
    assert st.errors.get("unreadable") == 1
    text = metrics.render().decode()
    assert 'steptail_errors_total{reason="unreadable",run="r",source="stream content"} 1.0' in text
