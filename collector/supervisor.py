"""Running the followers: one supervised task per run (a failing run is restarted on its own
and never stops another), discovery shared by all, clean shutdown on SIGTERM/SIGINT:
every kubectl killed by PID, every row flushed and committed, Parquet closed.

One run's path is put together in one place, `Supervisor.assemble_run`: discovery →
follower → model → sink → detectors."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path

from steptail.collector import events, kubectl
from steptail.collector.alerts import Alerter
from steptail.collector.detect import Detectors
from steptail.collector.discovery import Discovery
from steptail.collector.follower import FollowConfig, RunFollower, RunStatus
from steptail.collector.health import Health
from steptail.collector.kubectl import KubeTarget
from steptail.collector.metrics import Metrics
from steptail.collector.sink import RunSink
from steptail.runs.findings import Settings
from steptail.runs.model import RunModel
from steptail.runs.reference import ReferenceError, reference_for
from steptail.storage.db import Store
from steptail.storage.sources import SourceConflict, kubernetes_source
from steptail.storage.sql import SqlSink, load_model

log = logging.getLogger("steptail.follow")
GIVE_UP_KINDS = ("auth", "forbidden", "network")  # failing from start-up: a configuration error


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
    alerts: Alerter | None = None  # findings to logs and webhooks (collector.live sets it)
    metrics: Metrics | None = None  # Prometheus (collector.live sets it)
    settings: Settings | None = None  # the detectors' knobs (None: defaults)
    # HF reference CE per step for the step-1 gate, or a directory of per-run files
    reference_ce: dict[int, float] | Path | None = None
    # follow into runs that hold data of another source (e.g. the same run's ingested logs)
    append: bool = False
    # seconds a pod list refused (401/403) or an unreachable API may last from start-up before
    # giving up: that is a configuration error (RBAC, credentials, address), not an outage
    give_up: float = 30.0
    # called with each step, rbf row, stream gap and finding once committed, and each follower
    # state change (collector.events); None costs nothing
    on_event: events.Hook | None = None


class Supervisor:
    def __init__(self, store: Store, plan: Plan) -> None:
        self.store, self.plan = store, plan
        self.discovery = Discovery(plan.target, plan.selector if plan.follow_all else None, plan.metrics)
        self.discovery.on_failure = self._discovery_failed
        self.fatal: str | None = None  # why following gave up (a configuration error): exit 2
        self.status: dict[str, RunStatus] = {}
        self.health: dict[str, Health] = {}  # run -> its follower's health
        self.followers: dict[str, RunFollower] = {}
        self.detectors: dict[str, Detectors] = {}
        self.tasks: dict[str, asyncio.Task] = {}
        self.stopping = asyncio.Event()

    # -- lifecycle -----------------------------------------------------------------------------
    async def run(self, install_signals: bool = True) -> dict[str, RunStatus]:
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stopping.set)
        try:
            self.discovery.on_jobset = self._discovered if self.plan.follow_all else None
            await self.discovery.start()
            for jobset, run in self.plan.jobsets.items():
                await self.add(jobset, run)
            waiter = asyncio.create_task(self.stopping.wait())
            while not self.stopping.is_set():
                self.fatal = self._given_up()
                if self.fatal:
                    break
                active = [t for t in self.tasks.values() if not t.done()]
                if not active and (not self.plan.follow_all or (self.plan.config.until_done and self.tasks)):
                    break  # with --all --until-done: every run found so far is done
                # bounded: runs found by discovery (--all) join while we wait
                await asyncio.wait([waiter, *active], timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
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
        await cancel_all(list(self.tasks.values()))
        kubectl.kill_all()
        for run, f in self.followers.items():
            try:
                await f._final_flush()
            except Exception as exc:  # noqa: BLE001 - report, flush the others
                log.error("%s: final flush failed: %s", run, exc)
            else:
                await asyncio.to_thread(f.sink.compact_parquet)
            if self.status[run].state != "done":
                self._set_state(run, "stopped")
        self.discovery.stop()

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

    def _discovery_failed(self, kind: str, reason: str) -> None:
        """Pods cannot be listed or watched: every run is blind to restarts meanwhile (an
        auth or stream failure finding; the engine alerts once per position). Not for what
        may yet be a configuration error (see _given_up): that ends in one line of its own."""
        if not self.discovery.listed and kind in GIVE_UP_KINDS:
            return
        for det in self.detectors.values():
            det.failure(kind, f"pod discovery: {reason}")

    # -- runs ----------------------------------------------------------------------------------
    def _discovered(self, jobset: str) -> None:
        if jobset not in self.tasks and not self.stopping.is_set():
            asyncio.get_running_loop().create_task(self.add(jobset, jobset))

    async def add(self, jobset: str, run: str) -> None:
        if run in self.tasks:
            return
        status = self.status[run] = RunStatus(run, jobset)
        if self.plan.metrics is not None:  # the run's counters at 0 from now: increase() sees the first
            self.plan.metrics.run_started(run, status)
        self.health[run] = Health("follower", run, self.plan.metrics, status)
        self.tasks[run] = asyncio.create_task(self._supervise(jobset, run, status), name=f"run:{run}")

    async def assemble_run(self, jobset: str, run: str, status: RunStatus) -> RunFollower:
        """One run's path, from kubectl's stdout to the store:

            discovery → follower → model → sink → detectors

        - discovery (self.discovery, shared by all runs) lists and watches the JobSet's
          process-0 pods;
        - the follower (RunFollower) reads them with `kubectl logs -f --timestamps`, oldest
          attempt first, and feeds each line to
        - the run model (RunModel), which parses it, drops what was read before (cursors)
          and files it under its incarnation; every flush interval
        - the sink (RunSink) takes the model's batch, commits it to SQL with the stream gaps,
          and hands it to
        - the detectors (Detectors), whose findings commit in the same transaction and then
          go to the alerts and metrics; the sink writes the committed rows to Parquet
          periodically.

        Built from the store side up, since each part is handed the next one down the path;
        the blocking parts (SQL, Parquet catch-up, reference files) run in threads."""
        store, plan, ns = self.store, self.plan, self.plan.target.namespace
        # the model: the run is claimed for this JobSet before anything of it starts (a run of
        # another source refuses it: SourceConflict), then resumed from the store's cursors
        model = await asyncio.to_thread(_claim_and_load, store, run, jobset, ns, plan.append)
        # the detectors: resumed from the store's findings, with the step-1 gate's reference CE
        try:
            reference = await asyncio.to_thread(reference_for, plan.reference_ce, run)
        except ReferenceError as exc:  # this run's file is bad: say so, follow without it
            log.error("%s: %s", run, exc)
            status.last_error, reference = str(exc), None
        detectors = self.detectors[run] = await asyncio.to_thread(  # also told when discovery fails
            Detectors, run, store, plan.alerts, plan.metrics, plan.settings, reference)
        # the sink: SQL, then the detectors, then Parquet (catching up what a killed collector left)
        sink = await asyncio.to_thread(RunSink, store, run, plan.parquet, detectors, plan.config.parquet_every,
                                       jobset, ns)
        # the follower: process 0's pods, from discovery, read into the model
        follower = RunFollower(run, jobset, plan.target, self.discovery, model, sink, detectors, plan.config,
                               status, self.health.get(run))
        follower.on_event = sink.on_event = detectors.on_event = plan.on_event
        self.followers[run] = follower  # flushed at shutdown
        return follower

    async def _supervise(self, jobset: str, run: str, status: RunStatus) -> None:
        backoff = 0.5
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
                health = self.health.get(run) or Health("follower", run, self.plan.metrics, status)
                if isinstance(exc, kubectl.KubectlMissing):
                    kind, reason, trace = "kubectl_missing", str(exc), None
                else:
                    kind, reason, trace = "collector", f"collector error: {exc!r}"[:300], exc
                health.fail(kind, reason, exc_info=trace)  # logged (with the traceback) once per state
                status.last_error = reason
                self._set_state(run, "restarting after an error")
                if follower is not None:
                    follower.detectors.failure(kind, reason)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    def _set_state(self, run: str, state: str) -> None:
        status = self.status[run]
        if state != status.state:
            events.state_changed(self.plan.on_event, run, state, status.pod)
        status.state = state


def _claim_and_load(store: Store, run: str, jobset: str, namespace: str, append: bool) -> RunModel:
    """The run claimed for its JobSet (SourceConflict if it holds another source's data) and
    its model loaded, in one transaction."""
    with store.engine.begin() as conn:
        SqlSink(store).ensure_run(conn, run, jobset, namespace, append=append,
                                  source=kubernetes_source(namespace, jobset))
        return load_model(conn, run)


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
