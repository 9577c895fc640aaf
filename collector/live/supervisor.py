"""Running the followers: one supervised task per run (a failing run is restarted on its own
and never stops another), discovery shared by all, clean shutdown on SIGTERM/SIGINT:
every kubectl killed by PID, every row flushed and committed, Parquet closed.

One run's path is put together in one place, collector.live.assemble: discovery → follower
→ model → sink → detectors; the Supervisor asks for it and supervises it."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from steptail.collector.cluster import kubectl
from steptail.collector.cluster.discovery import PAGE_SIZE, REFUSED_LOGGED, Discovery, Refusal
from steptail.collector.cluster.jobsets import ClusterObjects
from steptail.collector.cluster.kubectl import KubeTarget
from steptail.collector.live.assemble import RunAssembly
from steptail.collector.live.detect import Detectors
from steptail.collector.live.follower import FollowConfig, RunFollower, RunStatus
from steptail.collector.live.lake_feed import LakeWriter
from steptail.collector.live.ownership import INTERVAL, LOOK_TIMEOUT, OUTAGE_RETRY_MAX, Ownership
from steptail.collector.live.run_end import RunEnds
from steptail.collector.live.runbook_live import RunbookLive, RunTarget
from steptail.collector.notify.alerts import Alerter
from steptail.collector.notify.channel import Channel
from steptail.collector.notify.collector_events import CollectorEvents
from steptail.collector.notify.health import Backoff, Health
from steptail.collector.notify.metrics import Metrics
from steptail.runs.detect import Settings
from steptail.runs.findings import NO_STEP, UNSAFE_NAME, WARNING, Finding
from steptail.storage.db import Store
from steptail.storage.lake import Lake, is_lake
from steptail.storage.sources import SourceConflict

log = logging.getLogger("steptail.follow")
rlog = logging.getLogger("steptail.replicas")  # runs moving between replicas: INFO is shown
RESTART_MAX = 30.0  # seconds: longest wait before a run whose follower raised is started again
UNSEEN_AFTER = 10.0  # seconds after start-up a named JobSet with no process-0 pod is said to be missing


@dataclass
class Plan:
    """What to follow: named JobSets (run name per JobSet), or every JobSet whose process-0
    pods match `selector` (`follow_all`)."""

    target: KubeTarget
    jobsets: dict[str, str] = field(default_factory=dict)  # jobset -> run
    follow_all: bool = False
    selector: str | None = None
    parquet: str | None = None
    config: FollowConfig = field(default_factory=FollowConfig)
    alerts: Alerter | None = None  # findings to logs and webhooks (collector.live.wiring sets it)
    metrics: Metrics | None = None  # Prometheus (collector.live.wiring sets it)
    settings: Settings | None = None  # the detectors' knobs (None: defaults)
    # HF reference CE per step for the step-1 gate, or a directory of per-run files
    reference_ce: dict[int, float] | Path | None = None
    # follow into runs that hold data of another source (e.g. the same run's ingested logs)
    append: bool = False
    # seconds a pod list refused (401/403) or an unreachable API may last from start-up before
    # giving up: that is a configuration error (RBAC, credentials, address), not an outage
    give_up: float = 30.0
    # the live path's events: rows, stream gaps and findings once committed, each run's state
    # changes, the collector's events (collector.notify.channel; `follow -o ndjson` listens)
    channel: Channel = field(default_factory=Channel)
    # bounds on what a namespace can make us do: runs known (--all; beyond, one line and
    # steptail_errors_total{source="discovery",reason="max_runs"}) and pods per list request
    max_runs: int = 100
    page_size: int = PAGE_SIZE
    # the runbook's rules (runs.runbook.Policy) checked on the live JobSets and their pods
    # (collector.live.runbook_live); None: not checked, JobSets and Workloads not read
    policy: object | None = None
    # `follow --archive DIR`: archive(jobset, run) saves a failed JobSet's pod logs (True when
    # saved); set by the CLI, which may reach collector.archive (a room above this one)
    archive: Callable[[str, str], Awaitable[bool]] | None = None


class Supervisor:
    def __init__(self, store: Store, plan: Plan) -> None:
        self.store, self.plan = store, plan
        self.discovery = Discovery(plan.target, plan.selector if plan.follow_all else None, plan.metrics,
                                   plan.page_size)
        # the collector's own faults (each spell of a source failing): health, never a run's findings
        self.collector_events = CollectorEvents(plan.metrics, plan.channel)
        self.discovery.health.events = self.collector_events
        self._events_health = Health("collector events store")  # saving them: one line per spell
        self.discovery.on_refused = self._refused
        self.over_max_runs = 0  # JobSets found beyond plan.max_runs: not followed
        self._found: set[str] = set()  # JobSets --all follows (at most plan.max_runs)
        self._publishing: set[asyncio.Task] = set()  # collector-level findings on their way
        self.fatal: str | None = None  # why following gave up (a configuration error): exit 2
        self.unseen: dict[str, str] = {}  # named JobSets with no process-0 pod so far -> what was said
        self._unselected: set[str] = set()  # JobSets --all --selector can never follow (said once)
        self._started_at = time.monotonic()
        self.status: dict[str, RunStatus] = {}
        self.health: dict[str, Health] = {}  # run -> its follower's health
        self.followers: dict[str, RunFollower] = {}
        self.detectors: dict[str, Detectors] = {}
        self.tasks: dict[str, asyncio.Task] = {}
        self.stopping = asyncio.Event()
        # PostgreSQL: replicas share the runs, each following those it owns (collector.live.ownership);
        # SQLite has one writer (collector.live.wiring refuses a second follow on the file)
        self.ownership = None if store.is_sqlite else Ownership(store)
        self.candidates: dict[str, str] = {}  # run -> jobset: found, to follow here or elsewhere
        self._balancer: asyncio.Task | None = None
        # the ownership connection: failing loses every run here (logged, counted, summarised)
        self.ownership_health = Health("ownership", "", plan.metrics) if self.ownership is not None else None
        self._look_now = asyncio.Event()
        self.ends = RunEnds(self)  # each run's heartbeat and end (JobSet failed/completed) to the store
        # --parquet URL: the lake, one writer (one commit per table and period) for every run here
        self.lake = None
        if is_lake(plan.parquet):
            self.lake = LakeWriter(store, Lake(plan.parquet, store.catalog_url(),
                                   writer=self.ownership.replica if self.ownership is not None else None),
                                   plan.config.parquet_every)
        self.assembly = RunAssembly(store, plan, self.discovery, self.collector_events, self.lake,
                                    self.ownership.replica if self.ownership is not None else None,
                                    self._lose_soon, self.ownership.gate if self.ownership is not None else None)
        # the runbook's rules on the live JobSets: their objects watched beside the pods
        self.objects = self.runbook = self._runbook_task = None
        if plan.policy is not None:
            self.objects = ClusterObjects(plan.target, plan.metrics, plan.page_size, self.discovery.recovery)
            self.runbook = RunbookLive(plan.policy, self.objects, self.discovery, self._runbook_targets, store,
                                       archive=plan.archive, metrics=plan.metrics)

    # -- lifecycle -----------------------------------------------------------------------------
    async def run(self, install_signals: bool = True) -> dict[str, RunStatus]:
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stopping.set)
        try:
            if self.ownership is not None:
                await self.ownership.connect()
                rlog.info("replica %s: following the runs it owns (shared through %s)",
                         self.ownership.replica, self.store.describe())
                self._balancer = asyncio.create_task(self._balance(), name="ownership")
            self.discovery.on_jobset = self._discovered if self.plan.follow_all else None
            await self.discovery.start()
            if self.runbook is not None:
                await self.objects.start()
                self._runbook_task = asyncio.create_task(self.runbook.run(self.stopping), name="runbook")
            for jobset, run in self.plan.jobsets.items():
                await self.want(jobset, run)
            waiter = asyncio.create_task(self.stopping.wait())
            while not self.stopping.is_set():
                self.fatal = self._given_up()
                if self.fatal:
                    break
                self._look_for_named()
                self._look_for_unselected()
                await self.ends.tick()
                active = [t for t in self.tasks.values() if not t.done()]
                elsewhere = [r for r in self.candidates if r not in self.tasks and not self.status[r].done]
                if not active and not elsewhere and (
                        not self.plan.follow_all or (self.plan.config.until_done and self.status)):
                    break  # with --all --until-done: every run found so far is done
                # bounded: runs found by discovery (--all) join while we wait
                await asyncio.wait([waiter, *active], timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                await self.save_events()
            waiter.cancel()
        finally:
            await self.shutdown()
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
        return self.status

    def stop(self) -> None:
        self.stopping.set()

    async def shutdown(self) -> None:
        if self._balancer is not None:
            await cancel_all([self._balancer])
        if self._runbook_task is not None:
            await cancel_all([self._runbook_task])
            try:  # a last look: a run that ended between two passes is judged too (its findings
                self.runbook.check_all()  # commit with the final flush below)
            except Exception as exc:  # noqa: BLE001 - said; the shutdown goes on
                log.warning("runbook rules, last pass: %s", exc)
            await self.runbook.close()
            self.objects.stop()  # halted now, waited for with discovery's threads at the end
        await cancel_all(list(self.tasks.values()))
        kubectl.kill_all()
        for run, f in self.followers.items():
            try:
                await f.final_flush()
            except Exception as exc:  # noqa: BLE001 - report, flush the others
                log.error("%s: final flush failed: %s", run, exc)
            else:
                await asyncio.to_thread(f.sink.compact_parquet)
            if not self.status[run].done:  # done: "done", or "failed" (collector.live.run_end)
                self._set_state(run, "stopped")
        await self.ends.close()
        if self.ownership is not None:  # after the final commits: the locks fall, others take over
            try:
                await self.ownership.close()
            except Exception as exc:  # noqa: BLE001 - the connection is gone: so are the locks
                log.debug("closing the ownership connection: %s", exc)
        await self.discovery.close()
        if self.objects is not None:
            await self.objects.close()
        await self.save_events()

    async def save_events(self) -> None:
        """The collector events changed since the last save, stored (a failure: one line, kept
        for the next save)."""
        if not self.collector_events.unsaved:
            return
        try:
            await asyncio.to_thread(self.collector_events.save, self.store)
        except Exception as exc:  # noqa: BLE001 - the store: retried at the next save
            self._events_health.fail("store", f"collector events not stored: {str(exc).splitlines()[0][:200]}")
        else:
            self._events_health.ok()

    def _given_up(self) -> str | None:
        """The pod list refused (401/403), or the API unreachable, ever since start-up and for
        `give_up` seconds: what to say on exit. A failure after pods were listed is retried."""
        d = self.discovery
        if d.listed or d.health.failing is None or d.health.failing_for() < self.plan.give_up:
            return None
        kind, reason = d.health.failing
        ns = self.plan.target.namespace
        if kind in ("auth", "forbidden"):
            return (f'cannot list pods in namespace "{ns}": {reason}; '
                    "apply deploy/rbac.yaml or check --account/--context")
        if kind == "network":
            return (f"cannot reach the Kubernetes API at {d.server or '?'}: {reason}; "
                    "check --kubeconfig/--context")
        return None

    def _look_for_named(self) -> None:
        """A JobSet named with --jobset that has no process-0 pod UNSEEN_AFTER seconds after the
        pods were listed (a typo, another namespace, a Workload waiting for quota): one line,
        and one when it appears; `follow` exits non-zero if it never did."""
        if not self.discovery.listed or time.monotonic() - self._started_at < UNSEEN_AFTER:
            return
        ns = self.plan.target.namespace
        for jobset, run in self.plan.jobsets.items():
            seen = self.discovery.seen(jobset) or (run in self.status and self.status[run].rows > 0)
            if seen and jobset in self.unseen:
                del self.unseen[jobset]
                log.info("JobSet %s appeared: following it as run %s", jobset, run)
            elif not seen and jobset not in self.unseen:
                exists = self.objects is not None and jobset in self.objects.jobsets
                self.unseen[jobset] = (
                    f"JobSet {jobset} has no process-0 pod yet in namespace {ns} (it exists: waiting for "
                    "Kueue to admit it?)" if exists else
                    f"JobSet {jobset} not found in namespace {ns}: no process-0 pod after "
                    f"{UNSEEN_AFTER:.0f} s (check the name and -n; kubectl get jobsets -n {ns})")
                log.error("%s", self.unseen[jobset])

    def _look_for_unselected(self) -> None:
        """--all --selector: a JobSet none of whose replicated jobs can match the selector
        (e.g. the Deployment's default `replicatedjob-name=slice` and a JobSet whose job has
        another name) is never followed: said once per JobSet, not left silent."""
        if not (self.plan.follow_all and self.plan.selector and self.objects is not None):
            return
        for name, obj in list(self.objects.jobsets.items()):
            if name in self._found or name in self._unselected:
                continue
            if not any(_selects(self.plan.selector, labels) for labels in _replicated_job_labels(obj)):
                self._unselected.add(name)
                log.warning("JobSet %s is not followed: no replicated job of it matches --selector %s",
                            name, self.plan.selector)

    def _runbook_targets(self) -> dict[str, RunTarget]:
        """The runs followed here, by JobSet: only their owner checks their rules."""
        return {jobset: RunTarget(run, jobset, self.detectors[run], self.followers.get(run))
                for run, jobset in self.candidates.items() if run in self.detectors}

    # -- runs ----------------------------------------------------------------------------------
    def _discovered(self, jobset: str) -> None:
        if jobset in self._found or self.stopping.is_set():
            return
        if len(self._found) >= self.plan.max_runs:  # a namespace flood: a log line, not the collector
            self.over_max_runs += 1
            if self.plan.metrics is not None:
                self.plan.metrics.error("", "discovery", "max_runs")
            if self.over_max_runs == 1:
                log.error("pod discovery: more JobSets than --max-runs=%d; %s and any further ones are not "
                          "followed (counted in steptail_errors_total{source=\"discovery\",reason=\"max_runs\"})",
                          self.plan.max_runs, jobset)
            return
        self._found.add(jobset)  # now: discovery tells of a whole list's JobSets before any want() runs
        asyncio.get_running_loop().create_task(self.want(jobset, jobset))

    def _refused(self, refusal: Refusal) -> None:
        """A pod discovery refused (an unsafe name): never a run; a collector-level finding
        (run "") for the alerts, webhooks and metrics, for the first REFUSED_LOGGED."""
        n = self.discovery.refused_count
        if self.plan.alerts is None or n > REFUSED_LOGGED:
            return
        f = Finding(UNSAFE_NAME, "", n, NO_STEP, NO_STEP, f"{refusal.key} refused: {refusal.reason}"[:500],
                    WARNING, time.time_ns())
        task = asyncio.get_running_loop().create_task(self.plan.alerts.publish([f]))
        self._publishing.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._publishing.discard)

    async def want(self, jobset: str, run: str) -> None:
        """A run to follow: here at once (one store, one follower), or when this replica
        takes it (ownership: its next look at the fleet, at once)."""
        if run in self.candidates:
            return
        self.candidates[run] = jobset
        if self.ownership is None:
            await self.add(jobset, run)
            return
        self.status.setdefault(run, RunStatus(run, jobset, state="not owned yet", channel=self.plan.channel))
        self._look_now.set()

    async def add(self, jobset: str, run: str) -> None:
        if run in self.tasks:
            return
        status = self.status[run] = RunStatus(run, jobset, channel=self.plan.channel)
        if self.plan.metrics is not None:  # the run's counters at 0 from now: increase() sees the first
            self.plan.metrics.run_started(run, status)
        self.health[run] = Health("follower", run, self.plan.metrics, status)
        self.tasks[run] = asyncio.create_task(self._supervise(jobset, run, status), name=f"run:{run}")

    # -- replicas (PostgreSQL) -----------------------------------------------------------------
    async def _balance(self) -> None:
        """Every INTERVAL (or at once when a run is found): heartbeat, then take, give back and
        drop runs as collector.live.ownership decides.

        The connection failing (a store outage) stops no run: each goes on reading, its rows
        wait in memory (RunSink, bounded) and commit once the store is back — only while the
        run's epoch is still ours (the fence), i.e. no other replica took it meanwhile. Once
        the connection is back, the locks of the runs followed here are taken again; a run
        another replica holds by then is stopped, its waiting rows dropped (that replica
        re-reads them from the pod, if the pod still holds them)."""
        own, health = self.ownership, self.ownership_health
        backoff = INTERVAL
        ticker = asyncio.create_task(own.gate.tick_forever(), name="read gate")
        try:
            await self._balance_until_stopped(own, health, backoff)
        finally:
            ticker.cancel()

    async def _balance_until_stopped(self, own: Ownership, health: Health, backoff: float) -> None:
        while not self.stopping.is_set():
            started = own.gate.look_started()
            try:
                # a list, not a generator: discovery adds candidates while the heartbeat is awaited
                wanted = [r for r in self.candidates if not self.status[r].done]
                async with asyncio.timeout(LOOK_TIMEOUT):  # a connection that hangs is failing too
                    moves = await own.look(wanted)
            except Exception as exc:  # noqa: BLE001 - the store: retried; the runs go on reading
                if isinstance(exc, TimeoutError):
                    exc = TimeoutError(f"no answer in {LOOK_TIMEOUT:.0f} s")
                health.fail("store", f"ownership connection: {str(exc).splitlines()[0][:200]}")
                # at once: a session ended alone (the store up) is back, with its locks, before
                # another replica takes them (ownership.HANDOVER_WAIT); the back-off is for an outage
                try:
                    async with asyncio.timeout(LOOK_TIMEOUT):
                        taken = await own.reconnect()
                except Exception as again:  # noqa: BLE001 - next round
                    log.debug("ownership reconnect: %s", again)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, OUTAGE_RETRY_MAX)
                    continue
                for run in taken:
                    await self._lose(run, "another replica took it while the ownership connection was down")
                own.gate.looked(started)  # its locks taken back: the runs still here are its own
                continue
            health.ok()
            backoff = INTERVAL
            for run in moves.lost:
                await self._lose(run, "its lock fell (the ownership connection was lost)")
            own.gate.looked(started)
            if moves.take:
                names = ", ".join(moves.take[:10]) + (", …" if len(moves.take) > 10 else "")
                rlog.info("replica %s took %d runs (%s): %d of %d owned here", own.replica, len(moves.take),
                          names, len(own.owned), len(self.candidates))
            for run in moves.take:
                self.tasks.pop(run, None)
                await self.add(self.candidates[run], run)
            if moves.give:  # each flushed and committed, then released; in parallel
                await asyncio.gather(*(self._give(run) for run in moves.give))
            for run, status in self.status.items():
                if status.done and run in own.owned and run in self.tasks and self.tasks[run].done():
                    await own.release(run)  # done here: others may look at it, it stays done here
            if self.plan.metrics is not None:
                self.plan.metrics.owned(len(own.owned))
            self._show_owners()
            self._look_now.clear()
            try:
                async with asyncio.timeout(INTERVAL):
                    await self._look_now.wait()
            except TimeoutError:
                pass

    def _show_owners(self) -> None:
        survey = self.ownership.survey
        for run in self.candidates:
            if run in self.tasks or survey is None:
                continue
            owner = survey.owner_of(run)
            self._set_state(run, f"followed by replica {owner.replica}" if owner else "not owned yet")

    def _lose_soon(self, run: str, reason: str) -> None:
        """From the sink, whose commit the fence refused: stop the run (not from inside it)."""
        asyncio.get_running_loop().create_task(self._lose(run, reason))

    async def _lose(self, run: str, reason: str) -> None:
        """This replica no longer owns `run`: stop it now, commit nothing more (the new owner
        re-reads from the committed cursor). A commit in flight ends before the run's lock is
        let go (held still when the fence refused a commit after an outage): the run is then
        taken again from its last commit, here or elsewhere."""
        task = self.tasks.pop(run, None)
        follower = self.followers.pop(run, None)
        self.detectors.pop(run, None)
        if self.plan.metrics is not None:  # no stale series of a run followed elsewhere now
            self.plan.metrics.run_stopped(run)
        if task is not None:
            rlog.warning("%s: no longer owned by this replica (%s): stopped, nothing more committed here",
                        run, reason)
            await cancel_all([task])
            self._set_state(run, "lost ownership")
        if follower is not None:
            await follower.sink.stop(reason)
        await self.ownership.drop(run)

    async def _give(self, run: str) -> None:
        """Hand a run over (above the fair share): stop its follower, commit what it read,
        then release the lock; the next owner resumes from that commit."""
        task = self.tasks.pop(run, None)
        follower = self.followers.pop(run, None)
        self.detectors.pop(run, None)
        if task is not None:
            await cancel_all([task])
        if follower is not None:
            try:
                await follower.final_flush()
            except Exception as exc:  # noqa: BLE001 - the next owner re-reads from the last commit
                log.warning("%s: final flush before the handover failed: %s", run, exc)
            else:
                await asyncio.to_thread(follower.sink.compact_parquet)
        await self.ownership.release(run)
        if self.plan.metrics is not None:
            self.plan.metrics.run_stopped(run)
        rlog.info("%s: handed over to another replica (%d of %d runs left here)", run,
                 len(self.ownership.owned), len(self.candidates))
        self._set_state(run, "handed over")

    async def assemble_run(self, jobset: str, run: str, status: RunStatus) -> RunFollower:
        """One run's path (collector.live.assemble), its follower and detectors known here."""
        follower = await self.assembly(jobset, run, status, self.health.get(run),
                                       on_detectors=partial(self.detectors.__setitem__, run))
        self.followers[run] = follower  # flushed at shutdown
        return follower

    async def _supervise(self, jobset: str, run: str, status: RunStatus) -> None:
        backoff = Backoff(start=0.5)  # the shared rule: doubling per kind, up to RESTART_MAX
        follower = None
        while not self.stopping.is_set():
            try:
                if follower is None:
                    follower = await self.assemble_run(jobset, run, status)
                await follower.run_forever()
                if status.done:
                    return
            except asyncio.CancelledError:
                raise
            except SourceConflict as exc:  # another source's run: this run is not followed, the others go on
                self._set_state(run, f"refused: {exc.holds}")
                status.last_error = (f"{exc.clash}: not followed; pass --append if it is the same run, "
                                     f"or follow it with --jobset {jobset} --run NAME")
                log.error("%s", status.last_error)
                return
            except Exception as exc:  # noqa: BLE001 - this run only: report, back off, go on
                health = (follower.health if follower is not None else self.health.get(run)) \
                    or Health("follower", run, self.plan.metrics, status)
                health.events = health.events or self.collector_events
                if isinstance(exc, kubectl.KubectlMissing):
                    kind, reason, trace = "kubectl_missing", str(exc), None
                else:
                    kind, reason, trace = "collector", f"collector error: {exc!r}"[:300], exc
                # logged (with the traceback) once per state; the follower, if built, hears it
                health.fail(kind, reason, exc_info=trace)
                self._set_state(run, "restarting after an error")
                backoff.fail(kind)
                await asyncio.sleep(backoff.delay(RESTART_MAX))

    def _set_state(self, run: str, state: str) -> None:
        self.status[run].set_state(state)


def _replicated_job_labels(jobset: dict) -> list[dict]:
    """The labels each replicated job's pods will carry (the JobSet controller adds the
    replicated job's name to its template's)."""
    out = []
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        if not isinstance(rj, dict):
            continue
        tmpl = ((((rj.get("template") or {}).get("spec") or {}).get("template") or {}).get("metadata") or {})
        labels = dict(tmpl.get("labels") or {}) if isinstance(tmpl, dict) else {}
        out.append({**labels, "jobset.sigs.k8s.io/replicatedjob-name": str(rj.get("name") or "")})
    return out


def _selects(selector: str, labels: dict) -> bool:
    """The equality terms of a label selector (k=v, k==v, k!=v) against `labels`; any other
    term (set-based) is taken as matching: only a sure mismatch is reported."""
    for term in selector.split(","):
        term = term.strip()
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term and not any(op in term for op in (" in ", " notin ")):
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
    return True


async def cancel_all(tasks: list[asyncio.Task], every: float = 1.0) -> None:
    """Cancel tasks and wait for them to end, cancelling again while any lives on: a cancel can
    be absorbed (a library catching CancelledError, a race in wait_for) and shutdown must not
    then wait forever on a follower that keeps reading."""
    while live := [t for t in tasks if not t.done()]:
        for t in live:
            t.cancel()
        await asyncio.wait(live, timeout=every)
    for t in tasks:
        if not t.cancelled() and t.exception() is not None:
            log.debug("task %s ended with %r", t.get_name(), t.exception())
