"""One run's path put together, from kubectl's stdout to the store:

    discovery → follower → model → sink → detectors

- discovery (shared by all runs) lists and watches the JobSet's process-0 pods;
- the follower (RunFollower) reads them with kubectl (a follow read of pods/log), oldest
  attempt first, and feeds each line to
- the run model (RunModel), which parses it, drops what was read before (identities and
  cursors) and files it under its incarnation; every flush interval
- the sink (RunSink) takes the model's batch, commits it to SQL with the stream gaps, and
  hands it to
- the detectors (Detectors), whose findings commit in the same transaction and then go to
  the alerts and metrics; the sink writes the committed rows to Parquet periodically.

Built from the store side up, since each part is handed the next one down the path; the
blocking parts (SQL, Parquet catch-up, reference files) run in threads. The Supervisor only
asks for a run's follower here and supervises it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from steptail.collector.cluster.discovery import Discovery
from steptail.collector.live.detect import Detectors
from steptail.collector.live.follower import RunFollower, RunStatus
from steptail.collector.live.read_gate import ReadGate
from steptail.collector.live.sink import RunSink
from steptail.collector.notify.collector_events import CollectorEvents
from steptail.collector.notify.health import Health
from steptail.runs.model import RunModel
from steptail.runs.reference import ReferenceError, reference_for
from steptail.storage.db import Store
from steptail.storage.raw import RawLog
from steptail.storage.replicas import fence, take_over
from steptail.storage.sources import check_source, kubernetes_source
from steptail.storage.sql import load_model
from steptail.storage.streams import record_reconnects

log = logging.getLogger("steptail.follow")
rlog = logging.getLogger("steptail.replicas")


@dataclass
class RunAssembly:
    """What every run's path shares: the store, the plan (collector.live.supervisor.Plan),
    discovery, the collector's events, the lake writer, and with replicas this replica's name
    and what to do when a commit finds the run taken (`lose(run, reason)`)."""

    store: Store
    plan: object
    discovery: Discovery
    collector_events: CollectorEvents
    lake: object | None = None  # collector.live.lake_feed.LakeWriter
    replica: str | None = None
    lose: Callable[[str, str], None] | None = None
    read_gate: ReadGate | None = None  # with replicas: reads wait after a pause (collector.live.read_gate)

    async def __call__(self, jobset: str, run: str, status: RunStatus, health: Health | None,
                       on_detectors: Callable[[Detectors], None] = lambda d: None) -> RunFollower:
        """The run's follower, its parts built. `on_detectors` is handed the detectors as soon
        as they exist (discovery's failures reach them from then on)."""
        store, plan, ns = self.store, self.plan, self.plan.target.namespace
        # the model: the run is claimed for this JobSet before anything of it starts (a run of
        # another source refuses it: SourceConflict), then resumed from the store's cursors
        model, epoch = await asyncio.to_thread(claim_and_load, store, run, jobset, ns, plan.append, self.replica)
        # the detectors: resumed from the store's findings, with the step-1 gate's reference CE
        try:
            reference = await asyncio.to_thread(reference_for, plan.reference_ce, run)
        except ReferenceError as exc:  # this run's file is bad: say so, follow without it
            log.error("%s: %s", run, exc)
            status.last_error, reference = str(exc), None
        detectors = await asyncio.to_thread(
            partial(Detectors, run, store, plan.alerts, plan.metrics, plan.settings, reference,
                    channel=plan.channel, collector_events=self.collector_events))
        on_detectors(detectors)
        status.findings = detectors.verdicts  # the live view's counts by severity and stall
        # the sink: SQL, then the detectors, then Parquet (catching up what a killed collector left);
        # with replicas every commit checks this replica still owns the run
        owned = self.replica is not None
        sink = await asyncio.to_thread(partial(
            RunSink, store, run, self.lake or plan.parquet, detectors, plan.config.parquet_every, jobset, ns,
            kubernetes_source(ns, jobset), plan.append, status=status,
            fence=(lambda conn: fence(conn, run, epoch)) if owned else None,
            on_lost=(lambda exc: self.lose(run, str(exc))) if owned and self.lose is not None else None,
            raw=RawLog(plan.config.raw, run) if plan.config.raw else None, channel=plan.channel))
        # the follower: process 0's pods, from discovery, read into the model
        return RunFollower(run, jobset, plan.target, self.discovery, model, sink, detectors, plan.config,
                           status, health, read_gate=self.read_gate)


def claim_and_load(store: Store, run: str, jobset: str, namespace: str, append: bool,
                   replica: str | None = None) -> tuple[RunModel, int | None]:
    """The run claimed for its JobSet (SourceConflict if it holds another source's data) and
    its model loaded, in one transaction.

    A replica (`replica`: it holds the run's owner lock) first waits for a commit of the
    previous owner still in flight and takes the run's next epoch (the fence its commits
    carry), so the model starts from the last committed cursor; a run another replica
    followed before records the handover with its reconnects. Returns (model, epoch)."""
    epoch = before = None
    with store.engine.begin() as conn:
        if replica is not None:
            before, epoch = take_over(conn, run, replica)
        # read-only: the run's row is written with its first record (collector.live.sink)
        check_source(conn, run, kubernetes_source(namespace, jobset), append=append)
        model = load_model(conn, run)
        if replica is not None:
            open_streams = sorted((c.hwm_ns or 0, k) for k, c in model.cursors.items() if not c.done)
            if before is not None and before != replica and open_streams:
                record_reconnects(conn, [(run, open_streams[-1][1], time.time_ns(), "handover")])
                last = model.current.last_step if model.current is not None else None
                rlog.info("%s: taken over from replica %s; resuming after step %s from the committed cursor",
                          run, before, last)
        return model, epoch
