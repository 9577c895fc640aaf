"""Run one chaos schedule end to end: the simulator, `steptail follow --all` as subprocesses
(one, or 2-3 replicas on PostgreSQL with their own faults), the store sampled while they run,
then the oracle's verdict. Shared by tests/test_chaos.py and benchmarks/chaos.py.

Each follower is a real `steptail follow` (real kubectl) in its own process group (killed whole,
as a container is) and its own PGAPPNAME, so its database sessions can be terminated alone.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa

from steptail.simcluster.chaos import (
    DB_KINDS,
    ChaosDriver,
    collector_plan,
    format_schedule,
    scenario_of,
    without_db_faults,
)
from steptail.simcluster.cluster import SimCluster
from steptail.simcluster.oracle import Observation, Verdict, blocks_log_reads, judge
from steptail.storage.db import open_store
from steptail.storage.reads import run_summaries

SAMPLE_EVERY = 0.25  # seconds between two looks at the store's row counts
# after every JobSet is done, rows unchanged this long ends the run: longer than the oracle's
# SERVABLE_SECONDS, so a step it requires had that long to arrive after the last write
SETTLE = 5.5
# ... or this long, once the oracle already passes with every step still served recorded: the
# awaited end came (nothing left to read), the rest of SETTLE would only wait
QUIET = 2.0
LOOK_EVERY = 1.0  # seconds between two early looks by the oracle (each reads the store)


def account(i: int) -> str:
    return f"chaos-{i}@steptail-sim.iam.gserviceaccount.com"


def app_name(i: int) -> str:
    return f"steptail-chaos-{i}"


@dataclass
class Follower:
    """One `steptail follow --all` subprocess (a replica when there are several)."""

    index: int
    argv: list[str]
    log: Path
    env: dict
    proc: subprocess.Popen | None = None
    spans: list[list[float]] = field(default_factory=list)  # [start, end] while running, not stopped
    resumes: list[float] = field(default_factory=list)  # the starts of spans that began with SIGCONT
    stopped: bool = False
    booting: list[int] = field(default_factory=list)  # spans of restarts not yet seen asking the API
    serves_health: bool = False  # started with a --metrics-port (replicas: a rolling restart reads /healthz)
    port: int | None = None  # the running process's --metrics-port
    # a rolling update's process being replaced (surge): (process, its span), and when it got SIGTERM
    outgoing: tuple[subprocess.Popen, list[float]] | None = None
    retired_at: float | None = None

    def start(self) -> None:
        if self.alive():
            # a kill's restart due while a rolling restart already started it again: a second
            # process would be orphaned (never terminated), its load on every later seed
            return
        argv = self.argv
        if self.serves_health:  # its /healthz: the readiness a rolling restart waits for
            self.port = _free_port()
            argv = [*argv, "--metrics-port", str(self.port)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"),
                                     env=self.env, start_new_session=True)
        if self.spans:  # a restart; the first start is timed from _wait_ready
            self.booting.append(len(self.spans))
        self.spans.append([time.time(), float("inf")])

    def up_at(self, sim: SimCluster) -> None:
        """A restarted follower runs from its first API request, as the first start does
        (_wait_ready): its seconds of interpreter start-up are no collector running, and one
        killed before it ever asked did not run at all."""
        for i in list(self.booting):
            span = self.spans[i]
            woke = sim.woke_since(account(self.index), span[0])
            if woke is not None and woke <= span[1]:
                span[0] = woke
            elif span[1] != float("inf"):
                span[0] = span[1]
            else:
                continue
            self.booting.remove(i)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _pause_span(self) -> None:
        if self.spans and self.spans[-1][1] == float("inf"):
            self.spans[-1][1] = time.time()

    def kill(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._pause_span()

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGSTOP)
            self.stopped = True
        self._pause_span()

    def cont(self) -> None:
        if self.alive() and self.stopped:
            os.killpg(self.proc.pid, signal.SIGCONT)
            self.stopped = False
            self.spans.append([time.time(), float("inf")])
            self.resumes.append(self.spans[-1][0])

    def ready(self) -> bool:
        """/healthz answers 200: discovery has listed pods (deploy/deployment.yaml's readinessProbe)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=0.5) as r:
                return r.status == 200
        except OSError:
            return False

    def surge(self) -> None:
        """A rolling update's first half (deploy/deployment.yaml: maxSurge 1, maxUnavailable 0):
        the successor starts beside the running process, which goes on as `outgoing` until
        retire(). Nothing running: the successor just starts."""
        if not self.alive():
            self.start()
            return
        if self.stopped:
            self.cont()  # as terminate(): what is replaced gets SIGCONT, then SIGTERM
        self.outgoing, self.proc = (self.proc, self.spans[-1]), None
        self.start()

    def retire(self) -> None:
        """SIGTERM to the outgoing process (it flushes, commits and exits); reap() sees it end."""
        if self.outgoing is not None and self.retired_at is None:
            self.outgoing[0].send_signal(signal.SIGTERM)
            self.retired_at = time.time()

    def reap(self, timeout: float = 30.0) -> None:
        """The outgoing process ended: its span ends; SIGKILL when it outlives `timeout` s."""
        if self.outgoing is None or self.retired_at is None:
            return
        proc, span = self.outgoing
        if proc.poll() is None:
            if time.time() - self.retired_at < timeout:
                return
            _end(proc, 0)
        span[1] = time.time()
        self.outgoing, self.retired_at = None, None

    def terminate(self, timeout: float = 30.0) -> None:
        """SIGTERM (flush, commit, stop kubectl), SIGKILL when it does not end in time; an
        outgoing process of a rolling update too."""
        if self.outgoing is not None:
            self.retire()
            _end(self.outgoing[0], timeout)
            self.reap()
        if not self.alive():
            self._pause_span()
            return
        self.cont()
        self.proc.send_signal(signal.SIGTERM)
        _end(self.proc, timeout)
        self._pause_span()


def _end(proc: subprocess.Popen, timeout: float) -> None:
    """Wait up to `timeout` s for a signalled process to exit, then SIGKILL its group."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


class Rollout:
    """A rolling restart as the Deployment rolls (maxSurge 1, maxUnavailable 0), one replica at
    a time: its successor starts beside it; once the successor is ready (/healthz), or after
    `ready_timeout` s, the old process gets SIGTERM and the next replica's turn comes. Stepped
    by the harness's loop, so the other replicas' faults (a kill's restart) go on meanwhile."""

    def __init__(self, followers: list[Follower], owner_lost: list, ready_timeout: float = 30.0) -> None:
        self.queue, self.owner_lost, self.ready_timeout = list(followers), owner_lost, ready_timeout
        self.current: Follower | None = None
        self.deadline = 0.0

    def step(self) -> bool:
        """One look; True once every replica has been replaced."""
        if self.current is None:
            if not self.queue:
                return True
            g = self.queue.pop(0)
            g.surge()
            if g.outgoing is not None:
                self.current, self.deadline = g, time.time() + self.ready_timeout
            return False
        g = self.current
        if g.ready() or time.time() >= self.deadline:
            self.owner_lost.append((time.time(), account(g.index)))
            g.retire()
            self.current = None
        return False


def terminate_sessions(db_url: str, i: int) -> int:
    """pg_terminate_backend on every session of replica i, in this scratch database only."""
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as c:
            return len(c.execute(sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = :app"), {"app": app_name(i)}).all())
    finally:
        engine.dispose()


class Sampler:
    """Row counts per run, every SAMPLE_EVERY s, read with storage.reads.run_summaries."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # a run that failed before it started: nothing to join
            self._thread.join(10)

    def _run(self) -> None:
        store = None
        while not self._stop.wait(SAMPLE_EVERY):
            try:
                if store is None:
                    store = open_store(self.db_url, create=False)
                self.samples.append((time.time(), {r["run"]: r["steps"] for r in run_summaries(store)}))
            except Exception:  # noqa: BLE001 - no schema yet, or the store is down: no sample
                if store is not None:
                    store.dispose()
                    store = None
        if store is not None:
            store.dispose()

    def last(self) -> dict[str, int]:
        return self.samples[-1][1] if self.samples else {}


def _write_timeline(sim: SimCluster, t0: float, path: Path) -> None:
    """Every API request, one a line in seconds from the schedule's start: asked, answered,
    who, status, method and path (kept with a failing seed: --keep)."""
    with path.open("w") as out:
        for asked, answered, user, method, url, status in sim.timeline():
            out.write(f"{asked - t0:8.3f} {answered - t0:8.3f} {user or '-'} {status} {method} {url}\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _follower(sim: SimCluster, db_url: str, i: int, workdir: Path, serves_health: bool) -> Follower:
    argv = [sys.executable, "-c", "from steptail.cli import main; main()", "follow", "--all",
            "-n", sim.namespace, "--kubeconfig", str(sim.kubeconfig_path), "--account", account(i),
            "--db", db_url, "--no-view", "--log-format", "json"]
    env = {**os.environ, "PGAPPNAME": app_name(i)}
    return Follower(i, argv, workdir / f"follow-{i}.log", env, serves_health=serves_health)


def run_schedule(schedule: dict, db_url: str, workdir: Path, *, timeout: float | None = None,
                 echo=None) -> tuple[Verdict, Observation]:
    """Serve `schedule`, follow it, judge it. `echo(text)` gets the verdict line and, on
    failure, the schedule and the offending steps."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    on_sqlite = sa.engine.make_url(db_url).get_backend_name() == "sqlite"
    if on_sqlite:
        schedule = without_db_faults(schedule)
    proxy = None
    if any(f.get("kind") in DB_KINDS for f in schedule["faults"]):
        from steptail.simcluster.dbproxy import DbProxy

        url = sa.engine.make_url(db_url)
        proxy = DbProxy(url.host or "127.0.0.1", url.port or 5432)
        proxy.start()
    plan = collector_plan(schedule)
    duration = schedule["chaos"]["duration"]
    # a bound only: a run ends when its counts settle. Generous, since on a loaded machine (CI: the
    # suite's other workers) a starved collector is still catching up, and stopped then, the
    # steps rotated away while it lagged were never looked for (seed 103 in CI: 98 "unflagged")
    timeout = timeout if timeout is not None else duration * 3 + 45
    late = plan["follow_at"] > 0
    scenario = scenario_of(schedule)
    if not late:  # the JobSets and the fault clock start once the follower is up (see _wait_ready)
        scenario = {**scenario, "jobsets": [], "faults": []}
    sim = SimCluster(scenario, state_dir=workdir / "sim", db_proxy=proxy).start_in_thread()
    follow_url = proxy.url(db_url) if proxy is not None else db_url  # the oracle reads around the proxy
    replicas = max(1, plan["replicas"])
    followers = [_follower(sim, follow_url, i, workdir, serves_health=replicas > 1) for i in range(replicas)]
    owner_lost: list[tuple[float, str]] = []
    sampler = Sampler(db_url)
    events = sorted(plan["events"], key=lambda e: e["at"])
    later: list[tuple[float, str, int]] = []  # (time, action, replica) follow-ups: SIGCONT, restart
    rollouts: list[Rollout] = []  # rolling restarts under way
    driver = None
    try:
        if late:  # the simulator's own timeline runs the faults, from its start
            t0 = time.time()
            _sleep_until(t0 + plan["follow_at"])
        for f in followers:
            f.start()
            if len(followers) > 1:
                time.sleep(0.5)  # staggered, as replicas of a Deployment roll out
        ready = _wait_ready(sim, followers)
        for f in followers:  # a collector runs from its first API request, not its exec
            f.spans[0][0] = max(f.spans[0][0], ready)
        if not late:
            t0 = time.time()
            for js in schedule["jobsets"]:
                sim.add_jobset(js)
            driver = ChaosDriver(sim, schedule, t0=time.monotonic()).start()
        sampler.start()
        deadline = t0 + timeout
        settled_since, last_counts = None, None
        settled = False
        next_look = 0.0
        while time.time() < deadline:
            now = time.time() - t0
            while events and events[0]["at"] <= now:
                _replica_event(events.pop(0), followers, db_url, owner_lost, later, rollouts)
            rollouts[:] = [r for r in rollouts if not r.step()]
            for item in sorted(later):
                if item[0] <= time.time():
                    later.remove(item)
                    _, action, i = item
                    followers[i].cont() if action == "cont" else followers[i].start()
            for f in followers:
                f.reap()
                f.up_at(sim)
            if not events and not later and not rollouts and _all_done(sim):
                counts = sampler.last()
                quiet = time.time() - settled_since if counts == last_counts else None
                if quiet is None:
                    settled_since, last_counts = time.time(), counts
                elif quiet >= SETTLE:
                    settled = True
                    break
                elif quiet >= QUIET and time.time() >= next_look:
                    next_look = time.time() + LOOK_EVERY
                    if _nothing_left(_observe(sim, schedule, followers, t0, sampler, owner_lost, time.time()),
                                     db_url):
                        settled = True
                        break
            time.sleep(0.1)
    finally:
        for f in followers:
            f.terminate()
        sampler.stop()
        if driver is not None:
            driver.stop()
        obs = _observe(sim, schedule, followers, t0, sampler, owner_lost, time.time())
        _write_timeline(sim, t0, workdir / "requests.log")
        sim.stop_thread()
        if proxy is not None:
            proxy.stop()
    verdict = _verdict(obs, db_url)
    if echo is not None:
        echo(verdict.line())
        if not settled:
            echo(f"(stopped at the {timeout:.0f} s deadline before the store settled: the collector may have lagged)")
        if not verdict.ok:
            echo(format_schedule(schedule))
            for o in verdict.offending:
                echo("  " + o)
            runs = sorted({m for o in verdict.offending for m in re.findall(r"\b(chaos-\d+)\b", o)})
            for line in _story(followers, runs, t0):
                echo("  " + line)
    return verdict, obs


def _observe(sim: SimCluster, schedule: dict, followers: list[Follower], t0: float, sampler: Sampler,
             owner_lost: list, ended: float) -> Observation:
    """What the run saw up to `ended` (the simulator's truth, when the collectors ran)."""
    for f in followers:
        f.up_at(sim)
    truths = {js["name"]: sim.truth(js["name"]) for js in schedule["jobsets"]}
    servable, written, reads = _line_truth(sim, schedule)
    faults = sim.truth.unavailable()
    return Observation(
        schedule=schedule, truths=truths, started=t0,
        collector=sorted((a, min(b, ended)) for f in followers for a, b in f.spans),
        samples=list(sampler.samples), log_reads=list(sim.log_reads) if len(followers) > 1 else [],
        owner_lost=list(owner_lost), ended=ended, servable=servable, written=written,
        unavailable=_outages(faults, ended), reads=reads,
        burst_ends=[None if o.to_ns is None else o.to_ns / 1e9 for o in faults if o.kind == "fail_next"],
        running={account(f.index): [(a, min(b, ended)) for a, b in f.spans] for f in followers},
        resumed={account(f.index): list(f.resumes) for f in followers})


def _verdict(obs: Observation, db_url: str, create: bool = True) -> Verdict:
    """The oracle's verdict on `obs` against the store."""
    store = open_store(db_url, create=create)
    try:
        return judge(obs, store)
    finally:
        store.dispose()


def _nothing_left(obs: Observation, db_url: str) -> bool:
    """Whether the oracle passes now with every step still served recorded: the collector has
    nothing left to read, and waiting out the rest of SETTLE would change nothing it judges."""
    try:
        verdict = _verdict(obs, db_url, create=False)
    except Exception:  # noqa: BLE001 - the store is away or a read failed mid-fault: look again later
        return False
    return verdict.ok and verdict.counts["unread_at_end"] == 0


def _replica_event(ev: dict, followers: list[Follower], db_url: str, owner_lost: list,
                   later: list, rollouts: list[Rollout]) -> None:
    f = followers[ev["replica"] % len(followers)]
    now = time.time()
    if ev["event"] == "kill":
        owner_lost.append((now, account(f.index)))
        f.kill()
        later.append((now + ev["back_after"], "start", f.index))
    elif ev["event"] == "stop":
        owner_lost.append((now, account(f.index)))
        f.stop()
        later.append((now + ev["seconds"], "cont", f.index))
    elif ev["event"] == "terminate_sessions":
        owner_lost.append((now, account(f.index)))
        terminate_sessions(db_url, f.index)
    elif ev["event"] == "rolling_restart":
        rollouts.append(Rollout(followers, owner_lost))


def _line_truth(sim: SimCluster, schedule: dict):
    """From the simulator's line truth: when each LOSS-PARTS line was servable and when it
    was written, and (every line) when it was written, first served and stopped being
    servable, in seconds."""
    servable, written, reads = {}, {}, {}
    for js in schedule["jobsets"]:
        for line in sim.truth.servable(js["name"]):
            until = [b for _, b in line.intervals if b is not None]
            reads.setdefault(js["name"], []).append(
                (line.wall_ns / 1e9, None if line.served_ns is None else line.served_ns / 1e9,
                 max(until) / 1e9 if len(until) == len(line.intervals) else None))
            if line.kind == "loss":
                key = (js["name"], line.incarnation, line.step)
                servable[key] = [(a / 1e9, None if b is None else b / 1e9) for a, b in line.intervals]
                written[key] = line.wall_ns / 1e9
    return servable, written, reads


def _outages(faults: list, ended: float) -> list[tuple[float, float]]:
    """When the API served no log at all (sim.truth.unavailable): auth lapses, and hangs and
    throttles of every path or of one a log read's path holds ("/log", "/pods"). Slow answers, denials (lists only) and 5xx bursts
    still let a follower read, so they stay inside the 5 s a step must have been servable."""
    out = []
    for o in faults:
        if o.kind == "auth_lapse" or (o.kind in ("hang_api", "throttle") and blocks_log_reads(o.params.get("path"))):
            out.append((o.from_ns / 1e9, ended if o.to_ns is None else o.to_ns / 1e9))
    return out


def _wait_ready(sim: SimCluster, followers: list[Follower], timeout: float = 60.0) -> float:
    """When the follower(s) first asked the API for pods (a slow start-up under load is not
    chaos: the schedule's clock starts then). Raises, with the followers' last log lines, when
    none did in `timeout` s or every one of them exited first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any("/pods" in path for _, path, _ in list(sim.requests)):
            if len(followers) > 1:
                time.sleep(2.0)  # the others, started after it, are up too by then
            return time.time()
        if not any(f.alive() for f in followers):
            raise RuntimeError(f"every follower exited before it reached the simulated cluster: {_tails(followers)}")
        time.sleep(0.05)
    raise TimeoutError(f"no follower reached the simulated cluster in {timeout:.0f} s: {_tails(followers)}")


def _tails(followers: list[Follower], lines: int = 3) -> str:
    """The last lines each follower logged, for a harness error."""
    out = []
    for f in followers:
        try:
            tail = f.log.read_text(errors="replace").strip().splitlines()[-lines:]
        except OSError as exc:
            tail = [f"(no log: {exc})"]
        code = None if f.proc is None else f.proc.poll()
        out.append(f"follower {f.index} (exit {code}): " + " | ".join(tail or ["(nothing logged)"]))
    return "; ".join(out)


def _story(followers: list[Follower], runs: list[str], t0: float, most: int = 40) -> list[str]:
    """What each follower logged about `runs` (and its health lines), seconds from the schedule's
    start: the collector's side of an offence, so a failure seen only in CI can be read."""
    out = []
    for f in followers:
        try:
            lines = f.log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        told = []
        for raw in lines:
            try:
                rec = json.loads(raw)
                at = datetime.fromisoformat(rec["time"].replace("Z", "+00:00")).timestamp() - t0
                text, logger = str(rec.get("message", "")), str(rec.get("logger", ""))
            except (ValueError, KeyError, TypeError):
                continue
            # a finding names its run in a field of its own, not in the message
            if any(r in text for r in runs) or rec.get("run") in runs or logger.endswith(".health"):
                told.append(f"follower {f.index} t={at:6.2f}s {logger.rsplit('.', 1)[-1]}: {text[:300]}")
        out += told[-most:]
    return out


def _all_done(sim: SimCluster) -> bool:
    with sim.lock:
        return all(js.state == "done" for js in sim.state.jobsets.values())


def _sleep_until(t: float) -> None:
    while time.time() < t:
        time.sleep(min(0.05, max(0.0, t - time.time())))
