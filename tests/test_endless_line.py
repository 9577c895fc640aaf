"""Issue 20, item 7: a line with no end: whatever the pod prints after it continues it. `kubectl
logs` held a whole line before printing it, so such a line grew it without bound (400 MB of
line: 867 MB of kubectl); the raw read streams it, and past FollowConfig.max_line_bytes of one
line the read stops. The next read starts after that line (its start learnt from a limitBytes
read; sinceTime has whole seconds, so the rest of that second is a stream gap); it is a bad
line, a failure (logged when it starts and clears, counted) and a finding. Every other step is
recorded exactly once.

Real kubectl against the simulated cluster (its `endless_line` fault)."""

from __future__ import annotations

import logging
import threading

import psutil
import pytest
from test_follow_support import (
    collector_events,
    findings,
    follow_sim,
    gaps,
    in_gap,
    recorded,
    scenario,
)

from steptail.collector.notify.metrics import Metrics

pytestmark = pytest.mark.timeout(150)
MiB = 1 << 20
LIMIT = 128 * MiB
LINE = "200Mi"  # `kubectl logs` grew to ~450 MiB holding it


@pytest.fixture(autouse=True)
def _account_env(monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")


def _kubectl_peak(marker: str, stop: threading.Event, peak: list[int]) -> None:
    while not stop.wait(0.05):
        for p in psutil.process_iter(["name", "cmdline"]):
            try:
                if p.info["name"] == "kubectl" and any(marker in a for a in p.info["cmdline"] or ()):
                    peak[0] = max(peak[0], p.memory_info().rss)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass


def test_a_line_with_no_end_is_bounded_skipped_and_flagged(make_simcluster, tmp_path, caplog):
    sim = make_simcluster(scenario({"action": "endless_line", "at_step": 60, "bytes": LINE},
                                   rate=20, log_max_size="1Gi"))
    caplog.set_level(logging.INFO, logger="steptail")
    stop, peak = threading.Event(), [0]
    sampler = threading.Thread(target=_kubectl_peak, args=(str(sim.kubeconfig_path), stop, peak), daemon=True)
    sampler.start()
    db, metrics = str(tmp_path / "s.db"), Metrics()
    try:
        sup = follow_sim(sim, db, metrics=metrics, max_line_bytes=LIMIT, timeout=120)
    finally:
        stop.set()
        sampler.join(5)
    # kubectl never holds the line: it stays far below what the line costs
    assert 0 < peak[0] < LIMIT, peak[0] / MiB

    with sim.lock:
        log = sim.pods[("default", sim.process0())].current.log
        (endless,) = [e for e in log.entries if e.unterminated]
    skip_to = (endless.ts_ns // 10**9 + 1) * 10**9
    truth = sim.truth()
    got = recorded(db, "r")
    assert len(got) == len(set(got))
    from steptail.parsers.timestamps import parse_rfc3339

    skipped = {(t.incarnation, t.step) for t in truth if endless.ts_ns < parse_rfc3339(t.timestamp) < skip_to}
    assert set(got) == {(t.incarnation, t.step) for t in truth} - skipped  # all else, once
    g = gaps(db, "r")
    assert [(start, end) for _, start, end, reason in g if "a line with no end" in reason] == [
        (endless.ts_ns, skip_to)]
    assert all(in_gap(t, g) for t in truth if (t.incarnation, t.step) in skipped)

    st = sup.status["r"]
    assert st.errors.get("line_too_long") == 1
    said = [rec.getMessage() for rec in caplog.records if "line_too_long" in rec.getMessage()]
    assert len(said) == 2 and "a line with no end" in said[0] and "ok again" in said[1], said
    # the collector's fault is a collector event; the steps it cost are a gap finding naming it
    assert not [k for k, _ in findings(db, "r") if k == "stream_failure"]
    (event,) = [e for e in collector_events(db, "r") if e["run"] == "r"]
    assert event["kind"] == "stream_failure" and "a line with no end" in event["reason"] and event["cleared"]
    named = [d for k, d in findings(db, "r") if k == "gap" and "a line with no end" in d]
    assert bool(named) == bool(skipped) == event["lost_steps"], (named, skipped, event)  # steps lost: named
    assert 'steptail_errors_total{reason="line_too_long",run="r",source="follower"} 1.0' in metrics.render().decode()
