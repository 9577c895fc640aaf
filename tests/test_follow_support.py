"""Helpers for the follow tests (no tests here): run the collector against a simulated
cluster with the real kubectl, and compare what it recorded with the simulator's truth."""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import subprocess
import time

import psutil
import sqlalchemy as sa
from sim_fixtures import FAST as SIM_FAST

from steptail.collector.cluster.kubectl import KubeTarget
from steptail.collector.live.follower import FollowConfig
from steptail.collector.live.supervisor import Plan, Supervisor
from steptail.parsers.timestamps import parse_rfc3339
from steptail.runs.rows import FINDINGS
from steptail.storage.db import open_store
from steptail.storage.reads import iter_loss_parts, list_findings, stream_gaps

# The simulator's fast scenario, smaller: fault tests need 160 steps on 2 hosts.
FAST = {**SIM_FAST, "jobsets": [{"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": 160, "checkpoint_period": 50}}]}


def scenario(*faults: dict, **over) -> dict:
    """A fresh scenario (a deep copy: a test that edits its JobSets never edits FAST)."""
    return copy.deepcopy({**FAST, **over, "faults": list(faults)})


def follow_sim(sim, db: str, jobsets: dict[str, str] | None = None, *, silence: float = 1.0,
               parquet: str | None = None, follow_all: bool = False, selector: str | None = None,
               expect_runs: int = 1, timeout: float = 60.0, raw: str | None = None, settings=None,
               metrics=None, **config) -> Supervisor:
    """Follow until every run is done (process 0 completed), bounded by `timeout`. `settings`:
    the detectors' (runs.detect.Settings); `config`: more FollowConfig fields."""
    store = open_store(db)
    target = KubeTarget(sim.scenario.namespace, sim.account, str(sim.kubeconfig_path))
    plan = Plan(target, jobsets if jobsets is not None else {"olmo3-sft": "r"}, follow_all=follow_all,
                selector=selector, parquet=parquet, settings=settings, metrics=metrics,
                config=FollowConfig(silence=silence, until_done=True, parquet_every=2.0, raw=raw, **config))

    async def main() -> Supervisor:
        sup = Supervisor(store, plan)
        task = asyncio.create_task(sup.run(install_signals=False))
        deadline = time.monotonic() + timeout
        while not task.done():
            st = sup.status.values()
            if follow_all and len(sup.status) >= expect_runs and all(s.done for s in st):
                sup.stop()
            if time.monotonic() > deadline:
                sup.stop()
                await task
                raise TimeoutError(f"runs not done: {[(s.run, s.state, s.last_step) for s in st]}")
            await asyncio.wait([task], timeout=0.1)
        await task
        return sup

    try:
        return asyncio.run(main())
    finally:
        store.dispose()


def rows(db: str, sql: str, run: str) -> list[tuple]:
    """Rows of one query about `run` (bound as :r), from a store opened for the purpose."""
    store = open_store(db)
    try:
        with store.engine.connect() as c:
            return [tuple(r) for r in c.execute(sa.text(sql), {"r": run})]
    finally:
        store.dispose()


def read(db: str, fn, *args) -> list:
    """What one of steptail.storage.reads' functions returns, from a store opened for the purpose."""
    store = open_store(db)
    try:
        return list(fn(store, *args))
    finally:
        store.dispose()


def recorded(db: str, run: str) -> list[tuple[int, int]]:
    return [(inc, step) for inc, step, *_ in read(db, iter_loss_parts, run)]


def gaps(db: str, run: str) -> list[tuple[str, int, int | None, str]]:
    return read(db, stream_gaps, run)


def findings(db: str, run: str) -> list[tuple[str, str]]:
    return [(f[FINDINGS.KIND], f[FINDINGS.DETAIL]) for f in read(db, list_findings, run)]


def collector_events(db: str, run: str | None = None) -> list[dict]:
    """The collector's own faults stored (storage.collector_events: the run's and pod
    discovery's, newest first)."""
    from steptail.storage.collector_events import read_events

    store = open_store(db)
    try:
        with store.engine.connect() as conn:
            return read_events(conn, run)
    finally:
        store.dispose()


def reconnects(db: str, run: str) -> list[tuple[str, int]]:
    """(reason, count) of the reconnects committed to the store (what the Fleet board counts)."""
    return rows(db, "SELECT reason, COUNT(*) FROM stream_reconnects WHERE run = :r GROUP BY reason", run)


def in_gap(t, gap_rows) -> bool:
    ts = parse_rfc3339(t.timestamp)
    return any(stream.startswith(t.pod_uid + "/") and start < ts and (end is None or ts <= end)
               for stream, start, end, _ in gap_rows)


def assert_exactly_once(sim, db: str, run: str, jobset: str | None = None) -> dict:
    """Recorded (incarnation, step) = every step written, once; the ones not recorded were
    never served and lie inside a recorded stream gap; everything still retrievable is in."""
    truth = sim.truth(jobset)
    rows = recorded(db, run)
    assert len(rows) == len(set(rows)), "duplicate steps recorded"
    got = set(rows)
    written = {(t.incarnation, t.step) for t in truth}
    assert got <= written, f"recorded steps the trainer never wrote: {sorted(got - written)[:5]}"
    retrievable = {(t.incarnation, t.step) for t in truth if t.retrievable}
    assert retrievable <= got, f"missing retrievable steps: {sorted(retrievable - got)[:10]}"
    g = gaps(db, run)
    lost = [t for t in truth if (t.incarnation, t.step) not in got]
    outside = [(t.incarnation, t.step) for t in lost if not in_gap(t, g)]
    detail = [(t.incarnation, t.step, t.pod_uid[:8], t.restart_count, t.rotated, t.served, t.timestamp)
              for t in lost if not in_gap(t, g)][:3]
    assert not outside, (f"steps lost outside any stream gap: {outside[:10]} ({len(outside)}); {detail}; "
                         f"gaps {[(s[:8] + s[-2:], a, b, r[:30]) for s, a, b, r in g]}")
    for t in truth:
        if t.rotated_unread:
            assert in_gap(t, g), f"rotated-away step {t.step} not inside a stream gap"
    return {"truth": truth, "got": got, "lost": lost, "gaps": g}


def kubectl_procs(marker: str) -> list[psutil.Process]:
    """kubectl processes whose command line mentions `marker` (our kubeconfig)."""
    out = []
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
            if cmd and os.path.basename(cmd[0]) == "kubectl" and any(marker in a for a in cmd):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def stop_replicas(procs: list[subprocess.Popen], wait: float = 30.0) -> None:
    """SIGTERM every replica still running (each in its own process group), then SIGKILL the
    group of any that outlives `wait`."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(wait)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)
