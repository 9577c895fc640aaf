"""Benchmark of the live collector against the simulated cluster with the real kubectl.

1. latency: from the simulator writing a line (its kubelet timestamp) to its row being
   committed, p50 and p99, at ~100 lines/s (simulator in its own process);
2. scale: 10 and 50 concurrent runs at ~20 lines/s each for SECONDS: lines lost (must be
   0), collector CPU and peak RSS, peak total kubectl RSS (simulator in its own process,
   collector = `steptail follow --all --until-done` in its own process);
3. rotation hang at 2, 20 and 200 lines/s with default options: how long the first step
   written after a log rotation (stream silent, no EOF) waits until it is committed;
4. a container quiet for 60 s: log requests per minute (the hang checks), reconnects;
5. (--replicas N, alone) N replicas sharing 200 runs x 5 lines/s through PostgreSQL for 120 s,
   one killed with SIGKILL at 60 s: lines lost and duplicated, time until the killed
   replica's runs are followed again, CPU and the sum of PSS over every process.

    .venv/bin/python benchmarks/follow.py --json [--seconds 60] [--runs 10,50]
    .venv/bin/python benchmarks/follow.py --json --replicas 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import sqlalchemy as sa
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from steptail.collector.cluster.kubectl import KubeTarget  # noqa: E402
from steptail.collector.live.follower import FollowConfig  # noqa: E402
from steptail.collector.live.sink import RunSink  # noqa: E402
from steptail.collector.live.supervisor import Plan, Supervisor  # noqa: E402
from steptail.runs.rows import COLUMNS, LOSS_PARTS  # noqa: E402
from steptail.simcluster.cluster import SimCluster  # noqa: E402
from steptail.storage.db import open_store  # noqa: E402

LINES_PER_STEP = 6.7  # the simulated trainer's process 0 writes ~6-7 lines per step
CLI = [sys.executable, "-c", "from steptail.cli import main; main()"]


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def _follow_until(account: str, kubeconfig: str, db: str, stop_when, silence: float,
                        timeout: float, policy=None) -> Supervisor:
    """Follow the JobSet `bench` until stop_when(supervisor) or `timeout` (`policy`: the
    runbook's rules checked live beside it, as `follow` does by default)."""
    store = open_store(db)
    plan = Plan(KubeTarget("default", account, kubeconfig), {"bench": "bench"},
                config=FollowConfig(silence=silence, until_done=True), policy=policy)
    sup = Supervisor(store, plan)
    task = asyncio.create_task(sup.run(install_signals=False))
    deadline = time.monotonic() + timeout
    while not task.done() and time.monotonic() < deadline and not stop_when(sup):
        await asyncio.sleep(0.02)
    sup.stop()
    await task
    store.dispose()
    return sup


def latency(seconds: float, policy=None, neighbours: int = 0) -> dict:
    """Per committed row: commit end (wall clock) minus the line's kubelet timestamp.
    `neighbours`: more JobSets in the namespace (not followed; their pods and objects watched
    and, with a policy, their start times read by the stagger rule)."""
    samples: list[float] = []
    orig = RunSink._commit

    first_commit: list[int] = []

    def timed(self, todo):
        out = orig(self, todo)
        now = time.time_ns()
        first_commit[:] = first_commit or [now]
        for batch, _ in todo:
            for table in ("loss_parts", "required_rbf", "pod_metrics"):
                ts = COLUMNS[table].TS_NS
                samples.extend((row[ts], (now - row[ts]) / 1e6) for row in getattr(batch, table) if row[ts])
        return out

    rate = 100 / LINES_PER_STEP
    steps = int(rate * seconds)
    scenario = {"rate": rate, "jobsets": [{"name": "bench", "hosts": 1, "trainer": {"steps": steps}}] + [
        {"name": f"other-{i:02d}", "hosts": 1, "rate": 0.5, "trainer": {"steps": steps}} for i in range(neighbours)]}
    with tempfile.TemporaryDirectory() as d, _sim_process(scenario, Path(d)) as (kubeconfig, account):
        RunSink._commit = timed
        try:  # the simulator has its own process: its GIL is not the collector's
            asyncio.run(_follow_until(account, kubeconfig, str(Path(d) / "l.db"), lambda s: False, 5.0,
                                      seconds + 30, policy))
        finally:
            RunSink._commit = orig
    # Lines written before the collector was streaming are a backlog, not latency: count the
    # lines written from one second after the first commit on.
    steady = [ms for ts, ms in samples if ts >= first_commit[0] + 1_000_000_000]
    return {"lines_per_s": 100, "rows": len(steady), "p50_ms": round(_pct(steady, 50), 1),
            "p99_ms": round(_pct(steady, 99), 1), "max_ms": round(max(steady), 1)}


def _commit_times(rows: list[tuple[int, int, int]]):
    """Patch RunSink._commit to record (step, kubelet ts, commit wall ns) of LOSS-PARTS rows."""
    orig = RunSink._commit

    def timed(self, todo):
        out = orig(self, todo)
        now = time.time_ns()
        for batch, _ in todo:
            step, ts = LOSS_PARTS.STEP, LOSS_PARTS.TS_NS
            rows.extend((row[step], row[ts], now) for row in batch.loss_parts if row[ts])
        return out

    return orig, timed


def rotation_hang(lines_per_s: float, trials: int = 3) -> dict:
    """Rotate process 0's log while followed with default options (the stream hangs, no EOF).
    delay_s: the first step written after the rotation, from written to committed (what the
    hang cost); resume_s: from the rotation to that row committed (includes waiting for the
    trainer's next step)."""
    rate = lines_per_s / LINES_PER_STEP
    interval = 1 / rate
    rows: list[tuple[int, int, int]] = []
    delays, resumes = [], []
    with tempfile.TemporaryDirectory() as d:
        sim = SimCluster({"rate": rate, "jobsets": [{"name": "bench", "hosts": 1,
                                                     "trainer": {"steps": 100000, "checkpoint_period": 10**6}}]},
                         state_dir=Path(d) / "sim").start_in_thread()
        marks: dict[str, float] = {}

        def stop_when(sup: Supervisor) -> bool:
            if not rows:
                return False
            now = time.time_ns()
            flowing = marks.setdefault("flowing", now)
            if "rotated" not in marks:
                # first let the follower learn the stream's pace (a few steps)
                if now - flowing > max(3.0, 5 * interval) * 1e9:
                    marks["rotated"] = time.time_ns()
                    sim.rotate("bench")
                return False
            after = [(ts, done) for _, ts, done in rows if ts > marks["rotated"]]
            if after:
                ts, done = min(after)
                delays.append((done - ts) / 1e9)
                resumes.append((done - marks["rotated"]) / 1e9)
                marks.clear()
                marks["flowing"] = time.time_ns()
            return len(delays) >= trials

        orig, timed = _commit_times(rows)
        RunSink._commit = timed
        try:
            asyncio.run(_follow_until(sim.account, str(sim.kubeconfig_path), str(Path(d) / "r.db"), stop_when,
                                      FollowConfig().silence, 60 + trials * 4 * max(3.0, 5 * interval)))
        finally:
            RunSink._commit = orig
            sim.stop_thread()
    return {"lines_per_s": lines_per_s, "options": "defaults", "trials": len(delays),
            "delay_s": [round(x, 2) for x in delays], "max_delay_s": round(max(delays), 2) if delays else None,
            "resume_s": [round(x, 2) for x in resumes]}


def quiet_container(seconds: float = 60.0) -> dict:
    """A container that prints nothing for `seconds` mid-run (a long checkpoint save), followed
    with default options: log requests per minute of silence (the hang checks), reconnects."""
    with tempfile.TemporaryDirectory() as d:
        sim = SimCluster({"rate": 3, "jobsets": [{"name": "bench", "hosts": 1, "trainer": {
            "steps": 30, "checkpoint_period": 1000}}], "faults": [
            {"action": "stall", "at_step": 15, "seconds": seconds}]}, state_dir=Path(d) / "sim").start_in_thread()
        marks: dict[str, int] = {}

        def log_requests() -> int:
            return sum(1 for _, path, _ in list(sim.requests) if path.split("?")[0].endswith("/log"))

        def stop_when(sup: Supervisor) -> bool:
            step = sim.last_step("bench")
            if step >= 15 and "start" not in marks:
                marks["start"] = log_requests()
            if step > 15 and "end" not in marks:
                marks["end"] = log_requests()
            return all(s.done for s in sup.status.values()) and bool(sup.status)

        try:
            sup = asyncio.run(_follow_until(sim.account, str(sim.kubeconfig_path), str(Path(d) / "q.db"),
                                            stop_when, FollowConfig().silence, seconds + 60))
        finally:
            sim.stop_thread()
    st = sup.status.get("bench")
    n = marks.get("end", 0) - marks.get("start", 0)
    return {"quiet_s": seconds, "log_requests": n, "log_requests_per_min": round(n * 60 / seconds, 1),
            "reconnects": st.reconnects if st else None, "stream_gaps": st.gaps if st else None}


@contextlib.contextmanager
def _sim_process(scenario: dict, folder: Path):
    """`steptail simcluster` in its own process; yields (kubeconfig path, account)."""
    scen, kc = folder / "scenario.yaml", folder / "kubeconfig"
    scen.write_text(yaml.safe_dump(scenario))
    sim = subprocess.Popen([*CLI, "simcluster", "--scenario", str(scen), "--kubeconfig-out", str(kc)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not kc.exists():
            if sim.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("simcluster did not start")
            time.sleep(0.05)
        yield str(kc), "steptail-agent@steptail-sim.iam.gserviceaccount.com"
    finally:
        sim.terminate()
        sim.wait(10)


def scale(runs: int, seconds: float) -> dict:
    """N JobSets at ~20 lines/s each, followed by `steptail follow --all --until-done`."""
    rate = 20 / LINES_PER_STEP
    steps = int(rate * seconds)
    scenario = {"rate": rate, "jobsets": [{"name": f"run-{i:02d}", "hosts": 1, "trainer": {"steps": steps}}
                                          for i in range(runs)]}
    with tempfile.TemporaryDirectory() as d, _sim_process(scenario, Path(d)) as (kc, account):
        env = {**os.environ, "CLOUDSDK_CORE_ACCOUNT": account}
        db = str(Path(d) / "s.db")
        follower = subprocess.Popen(
            [*CLI, "follow", "--all", "--until-done", "--kubeconfig", str(kc), "--db", db, "--no-view",
             "--silence", "10", "--duration", str(seconds * 3 + 60), "--json"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        p = psutil.Process(follower.pid)
        peak_rss = peak_kubectl = 0
        kubectl_max = 0
        started = time.monotonic()
        while follower.poll() is None:
            try:
                kids = [c for c in p.children(recursive=True) if c.name() == "kubectl"]
                peak_rss = max(peak_rss, p.memory_info().rss)
                total = sum(c.memory_info().rss for c in kids)
                peak_kubectl, kubectl_max = max(peak_kubectl, total), max(kubectl_max, len(kids))
                cpu = p.cpu_times()
            except psutil.Error:
                pass
            time.sleep(0.5)
        wall = time.monotonic() - started
        out, err = follower.communicate()
        store = open_store(db)
        with store.engine.connect() as c:
            counts = dict(c.execute(sa.text("SELECT run, COUNT(*) FROM loss_parts GROUP BY run")).all())
            gaps = c.execute(sa.text("SELECT COUNT(*) FROM stream_gaps")).scalar()
        store.dispose()
    lost_steps = sum(steps - counts.get(f"run-{i:02d}", 0) for i in range(runs))
    cpu_s = cpu.user + cpu.system
    return {
        "runs": runs, "lines_per_s_per_run": 20, "seconds": seconds, "steps_per_run": steps,
        "exit_code": follower.returncode,
        "lines_lost": round(lost_steps * LINES_PER_STEP), "steps_lost": lost_steps, "stream_gaps": gaps,
        "collector_cpu_s": round(cpu_s, 1), "collector_cpu_pct": round(100 * cpu_s / wall, 1),
        "collector_peak_rss_mb": round(peak_rss / 2**20, 1),
        "kubectl_processes": kubectl_max, "kubectl_peak_total_rss_mb": round(peak_kubectl / 2**20, 1),
    }


def _pss_and_cpu(pids: list[int]) -> tuple[int, float, int]:
    """(sum of PSS, sum of CPU seconds, kubectl processes) over the replicas and every child
    (kubectl, its auth plugin). PSS, not RSS: kubectl's code pages are shared by all of them."""
    pss = kubectls = 0
    cpu = 0.0
    for pid in pids:
        try:
            procs = [psutil.Process(pid)]
            procs += procs[0].children(recursive=True)
        except psutil.Error:
            continue
        for p in procs:
            try:
                pss += p.memory_full_info().pss
                t = p.cpu_times()
                cpu += t.user + t.system
                if p.pid == pid:  # children that ended (a reconnect's kubectl) and were reaped
                    cpu += t.children_user + t.children_system
                kubectls += p.name() == "kubectl"
            except psutil.Error:
                pass
    return pss, cpu, kubectls


def replicas(n: int, runs: int = 200, lines_per_s: float = 5.0, seconds: float = 120.0,
             kill_at: float = 60.0, log_dir: str | None = None) -> dict:
    """`n` replicas of `steptail follow --all` on one PostgreSQL, `runs` JobSets at
    `lines_per_s` each for `seconds`; replica 0 killed with SIGKILL (its process group, as a
    container is killed) at `kill_at`. The simulator (in this process, on its own thread)
    records every log request with the account (one per replica) that made it."""
    import signal

    from steptail.storage.scratch import scratch_database

    rate = lines_per_s / LINES_PER_STEP
    steps = int(rate * seconds)
    scenario = {"rate": rate, "jobsets": [{"name": f"run-{i:03d}", "hosts": 1, "trainer": {
        "steps": steps, "checkpoint_period": 10**6}} for i in range(runs)]}
    admin = os.environ.get("STEPTAIL_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    with tempfile.TemporaryDirectory() as d, scratch_database(admin, "steptail_bench") as db:
        sim = SimCluster(scenario, state_dir=Path(d) / "sim").start_in_thread()
        procs = []
        try:
            t0 = time.time()
            for i in range(n):
                env = {**os.environ, "CLOUDSDK_CORE_ACCOUNT": f"replica-{i}@steptail-sim.iam.gserviceaccount.com"}
                procs.append(subprocess.Popen(
                    [*CLI, "follow", "--all", "--kubeconfig", str(sim.kubeconfig_path), "--db", db, "--no-view"],
                    env=env, stdout=subprocess.DEVNULL, stderr=open(Path(log_dir or d) / f"replica-{i}.log", "wb"),
                    start_new_session=True))
            peak_pss, peak_kubectl, samples = 0, 0, []
            cpu_before_kill = 0.0
            killed_at = None
            while time.time() - t0 < seconds + 15:
                if killed_at is None and time.time() - t0 >= kill_at:
                    _, cpu_before_kill, _ = _pss_and_cpu([procs[0].pid])
                    open_at_kill = {r.pod for r in sim.log_reads if r.follow and r.end is None
                                    and r.user.startswith("replica-0@")}
                    os.killpg(procs[0].pid, signal.SIGKILL)
                    killed_at = time.time()
                    procs[0].wait(10)
                pss, cpu, kubectls = _pss_and_cpu([p.pid for p in procs if p.poll() is None])
                peak_pss, peak_kubectl = max(peak_pss, pss), max(peak_kubectl, kubectls)
                samples.append((time.time(), cpu))
                time.sleep(3.0)
            _, cpu_end, _ = _pss_and_cpu([p.pid for p in procs if p.poll() is None])
            wall = time.time() - t0
            reads = sim.log_reads
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
            sim.stop_thread()
        store = open_store(db)
        with store.engine.connect() as c:
            counts = dict(c.execute(sa.text("SELECT run, COUNT(*) FROM loss_parts GROUP BY run")).all())
            extra_incarnations = c.execute(sa.text(
                "SELECT COUNT(*) FROM incarnations WHERE incarnation > 1")).scalar()
            gaps = c.execute(sa.text("SELECT COUNT(*) FROM stream_gaps")).scalar()
            handovers = c.execute(sa.text(
                "SELECT COUNT(DISTINCT run) FROM stream_reconnects WHERE reason = 'handover'")).scalar()
        store.dispose()
    # followed again: the first follow stream of another replica on each pod replica 0 held
    again = []
    for pod in open_at_kill:
        starts = [r.start for r in reads if r.follow and r.pod == pod and r.start >= killed_at
                  and not r.user.startswith("replica-0@")]
        again.append(min(starts) - killed_at if starts else float("inf"))
    overlaps = 0
    by_pod: dict[str, list] = {}
    for r in reads:
        if r.follow:
            by_pod.setdefault(r.pod, []).append((r.start, r.end or wall + t0, r.user))
    for spans in by_pod.values():
        spans.sort()
        overlaps += sum(1 for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1] and a[2] != b[2])
    lost = sum(max(0, steps - counts.get(f"run-{i:03d}", 0)) for i in range(runs))
    return {
        "replicas": n, "runs": runs, "lines_per_s_per_run": lines_per_s, "seconds": seconds,
        "killed_at_s": kill_at, "steps_per_run": steps,
        "steps_lost": lost, "lines_lost": round(lost * LINES_PER_STEP),
        "steps_duplicated": extra_incarnations,  # a re-read filed twice would open an incarnation
        "stream_gaps": gaps, "runs_with_handover": handovers,
        "killed_replica_runs": len(open_at_kill),
        "followed_again_max_s": round(max(again), 2) if again else None,
        "followed_again_p50_s": round(_pct(again, 50), 2) if again else None,
        "moments_two_replicas_followed_one_pod": overlaps,
        "cpu_pct_all_replicas_and_kubectl": round(100 * (cpu_end + cpu_before_kill) / wall, 1),
        "peak_pss_mb_all_replicas_and_kubectl": round(peak_pss / 2**20, 1),
        "peak_kubectl_processes": peak_kubectl,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--seconds", type=float, default=60.0, help="duration of the scale runs")
    ap.add_argument("--runs", default="10,50", help="concurrent runs for the scale part")
    ap.add_argument("--rules", action="store_true",
                    help="only the latency part, without and with the runbook's rules checked live "
                         "(49 more JobSets in the namespace), in one run")
    ap.add_argument("--replicas", type=int, help="only the replicas part: N replicas on PostgreSQL, 200 runs x "
                                                 "5 lines/s for 120 s, one replica killed at 60 s")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    os.environ.setdefault("CLOUDSDK_CORE_ACCOUNT", "steptail-agent@steptail-sim.iam.gserviceaccount.com")
    if args.rules:
        from steptail.commands.lint import policy_from

        seconds = min(args.seconds, 20.0)
        off = latency(seconds, None, neighbours=49)
        on = latency(seconds, policy_from(None), neighbours=49)
        result = {"cpus": os.cpu_count(), "jobsets": 50, "latency_rules_off": off, "latency_rules_on": on,
                  "p50_ratio": round(on["p50_ms"] / off["p50_ms"], 2) if off["p50_ms"] else None,
                  "p99_ratio": round(on["p99_ms"] / off["p99_ms"], 2) if off["p99_ms"] else None}
        print(json.dumps(result) if args.json else json.dumps(result, indent=2))
        return
    if args.replicas:
        result = {"cpus": os.cpu_count(), "replicas": replicas(args.replicas)}
        print(json.dumps(result) if args.json else json.dumps(result, indent=2))
        return
    result = {
        "cpus": os.cpu_count(),
        "latency": latency(min(args.seconds, 20.0)),
        "rotation_hang": [rotation_hang(r) for r in (2, 20, 200)],
        "quiet_container": quiet_container(),
        "scale": [scale(int(n), args.seconds) for n in args.runs.split(",")],
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
