"""Following process 0 of one JobSet: its log, followed with kubectl (`get --raw` of pods/log
with follow and timestamps: what `kubectl logs -f --timestamps` asks, in one request), into
the run model.

One loop per run. Each pass looks at the JobSet's process-0 pods (oldest attempt first):
old pods are drained (a non-follow read from the last timestamp) before the newest one is
followed; an in-place container restart is caught up with `--previous`. A follow read that
ends "silent" (hung on a rotated file, as its watchdog found) is re-opened at once with
`--since-time`; the model's cursor drops the overlap. When a re-read does not reach back to
the last line read, the lines in between are gone: a stream gap is recorded. Failures are
reported once and backed off, never past a recovery or a deleting pod's grace period.

This module is the policy: what to read and when (which pod, drain or follow, handover to a
new pod, back-off). How a read is done — a follow read and its watchdog, a drain's read, a
look at the pod — is collector.live.stream_read; what is done with each line read (the
overlap check, the model, stream gaps, the streams read to their end) is
collector.live.stream_lines."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from steptail.collector.cluster import kubectl
from steptail.collector.cluster.discovery import Discovery, PodInfo, reason_of, retry_after
from steptail.collector.cluster.kubectl import KubeTarget
from steptail.collector.live.detect import Detectors
from steptail.collector.live.overlap import Overlap
from steptail.collector.live.prefetch import Prefetch
from steptail.collector.live.read_gate import ReadGate
from steptail.collector.live.sink import RunSink
from steptail.collector.live.spare import SpareRead
from steptail.collector.live.stream_lines import StreamLines, stream_key, stream_uid
from steptail.collector.live.stream_read import StreamReader
from steptail.collector.live.unseen_attempts import unseen_attempts
from steptail.collector.notify.channel import Channel, StateChanged
from steptail.collector.notify.health import Health
from steptail.parsers.fast import line_ts
from steptail.parsers.timestamps import format_ns
from steptail.runs.cursor import Cursor
from steptail.runs.model import RunModel
from steptail.runs.rows import LOSS_PARTS

log = logging.getLogger("steptail.follow")


@dataclass
class FollowConfig:
    # Longest a quiet stream goes unchecked: the watchdog's checks back off up to this, and a
    # stream whose checks fail is re-opened after this much quiet.
    silence: float = 30.0
    flush_interval: float = 0.05  # commit cadence (rows reach the store within ~this)
    drain_timeout: float = 30.0  # bound on one non-follow read
    backoff_max: float = 15.0
    until_done: bool = False  # stop when process 0 of the newest attempt completed
    parquet_every: float = 30.0
    raw: str | None = None  # follow --raw DIR: every line read kept in segments (storage.raw)
    # a stream whose lines are mostly unreadable (binary garbage) over a window this long is a
    # failure; a window mostly readable clears it
    unreadable_after: float = 10.0
    # a line longer than this stops the read and is skipped (a line with no end: what follows
    # continues it; collector.cluster.kubectl.MAX_LINE); None: unbounded
    max_line_bytes: int | None = kubectl.MAX_LINE


@dataclass
class RunStatus:
    """What the live view shows for one run."""

    run: str
    jobset: str
    pod: str | None = None
    state: str = "starting"
    last_step: int | None = None
    last_ce: float | None = None
    last_incarnation: int | None = None
    step_seconds: float | None = None
    lines: int = 0
    rows: int = 0
    reconnects: int = 0
    gaps: int = 0
    steps: int = 0  # LOSS-PARTS rows committed (a step read again after a restart counts again)
    failures: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # failures by kind (collector.notify.health)
    last_error: str | None = None
    done: bool = False
    # the run's findings by key, latest state (collector.live.detect.Detectors.verdicts)
    findings: dict = field(default_factory=dict, repr=False)
    channel: Channel | None = field(default=None, repr=False, compare=False)  # told each state change

    def set_state(self, state: str, pod: str | None = None) -> None:
        """The run's state (and pod, when given): a change is told once, here, whoever makes it
        (its follower, or the supervisor restarting it)."""
        pod = self.pod if pod is None else pod
        if self.channel is not None and (state, pod) != (self.state, self.pod):
            self.channel.emit(StateChanged(self.run, state, pod))
        self.state, self.pod = state, pod


def _upper(ns: int | None) -> int | None:
    """End of a window from a Kubernetes time (whole seconds, truncated): the next second."""
    return None if ns is None else ns + 1_000_000_000


# Longest back-off while a pod being deleted holds unread lines: its grace period is all the
# time left to read it, and a burst of 5xx answers queued behind an auth lapse (fourteen 503s,
# shared with other reads) outlasted the 5.6 s left at one retry each 0.5 s (seed 306): a
# retry is one log request of one pod, for a grace period at most.
DELETING_RETRY_S = 0.1
# Longest back-off while a process-0 container of the run runs: every second not read is a
# second a rotation can take. Five 503s in a row waited 0.25 + … + 8 s (16-25 s unread, up
# to 135 steps lost, issue 33); a retry a second costs one log request.
RUNNING_RETRY_S = 1.0
PAUSE_S = 1.0  # a sleep this much longer than asked: the process was not running (SIGSTOP, starved)
PAUSE_LOOK_S = 0.25  # how often the pause watch wakes: a short sleep, so a stop always falls inside one


class RunFollower:
    def __init__(self, run: str, jobset: str, target: KubeTarget, discovery: Discovery,
                 model: RunModel, sink: RunSink, detectors: Detectors, cfg: FollowConfig,
                 status: RunStatus, health: Health | None = None,
                 read_gate: ReadGate | None = None) -> None:
        self.run, self.jobset, self.target = run, jobset, target
        self.discovery, self.model, self.sink = discovery, model, sink
        self.detectors, self.cfg, self.status = detectors, cfg, status
        # kubectl and API reads of this run: failing until a read delivers again
        self.health = health or Health("follower", run, detectors.metrics, status)
        # one health for everything that talks to the cluster: a recovery anywhere ends our back-off
        self.recovery = discovery.recovery
        self.health.recovery = self.health.recovery or self.recovery
        # each failure told once, at its source: these hear it (collector.notify.health)
        self.health.subscribe("follower", self._failure_heard)
        self.health.events = self.health.events or detectors.collector_events  # not findings
        # every line read goes here: the overlap checks, stream gaps, streams read to their end
        self.lines = StreamLines(run, model, sink, detectors, status, self.health, cfg.unreadable_after)
        self._looked_for_vanished = False
        self.known: dict[str, PodInfo] = {}  # every process-0 pod seen, by uid
        # (restart attempt, creation) of every process-0 pod ever seen, by uid (known forgets
        # deleted ones): an attempt never seen between two is one whose log is lost whole
        self.attempts: dict[str, tuple[int, int | None]] = {}
        # pods a fresh read found deleted: the watch's view may list them for seconds more (while
        # it fails, e.g. after 503s); they are not read again nor their gap recorded on every pass
        self.gone: set[str] = set()
        self._hurried: set[str] = set()  # deleting pods a back-off was cut short for (once each)
        # the stream to re-open at once, without reading its pod first (hung, ended while its
        # container ran, or refused): the pod is read beside the re-read, not before it
        self._reopen: str | None = None
        # the streams a resumed model was reading (the collector restarted, or this replica took
        # the run over): the first read of the current one is a re-read too, its pod read beside
        # it — pod then log in series under a slow API left a taken-over run unread for seconds
        self._resumed: set[str] = {k for k, c in model.cursors.items() if not c.done}
        self._prefetch: Prefetch | None = None  # the newest pod read while an older one drains
        self.pauses = 0  # times the collector was found not running (a jump of the loop's clock)
        self.hosts: int | None = None  # the JobSet's host count, once its object is read (runbook_live)
        # how each stream is read (a follow read and its watchdog, a drain's read, a look at the pod)
        self.read = StreamReader(run, target, discovery, model, sink, self.lines, cfg, self.recovery, self.known,
                                 self._reading, self._set_state, read_gate)

    def _reading(self, pod: PodInfo) -> None:
        """The model files what follows under `pod`; an incarnation its lines open records
        what the pod runs on."""
        self.model.pod = pod.name
        self.model.ran_on(pod.name, image=pod.image or None, image_id=pod.image_id or None,
                          topology=pod.topology or None, hosts=self.hosts,
                          container_started_ns=pod.started_ns)

    def set_hosts(self, hosts: int | None) -> None:
        """The JobSet's host count, once its object is read (collector.live.runbook_live)."""
        if hosts and hosts != self.hosts:
            self.hosts = hosts
            if self.model.pod:
                self.model.ran_on(self.model.pod, hosts=hosts)

    # ------------------------------------------------------------------------ main loop
    async def run_forever(self) -> None:
        flusher = asyncio.create_task(self._flush_loop())
        watch = asyncio.create_task(self._pause_watch())
        try:
            while not self.status.done:
                await self._pass()
        finally:
            if self._prefetch is not None:
                self._prefetch.cancel()
            if self.read.spare is not None:
                await self.read.spare.stop()
            for task in (flusher, watch):
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass

    async def _pass(self) -> None:
        if not self._looked_for_vanished and self.discovery.listed:
            self._looked_for_vanished = True
            self.lines.vanished_while_away({p.uid for p in self.discovery.pods.values()})
        pods = [p for p in self.discovery.process0(self.jobset) if p.uid not in self.gone]
        for p in pods:
            if p.uid not in self.attempts:
                self._unseen_before(p)
                self.attempts[p.uid] = (p.attempt, p.created_ns)
            self.known[p.uid] = p
        live = {p.uid for p in pods}
        # pods gone from the API that were never read to the end
        for uid, p in sorted(self.known.items(), key=lambda kv: kv[1].order):
            if uid not in live and stream_key(p, p.restart_count) not in self.lines.finished:
                await self._drain(p, gone=True)
        if not pods:
            # one state per pass: setting "waiting" then "discovery failed" made it flap twice a second
            error = self.discovery.error
            self._set_state(f"discovery failed: {error[1]}" if error else
                            "waiting for process 0" if self.discovery.listed else "listing pods")
            await self.discovery.wait_change(2.0)
            return
        newest = pods[-1]
        for old in pods[:-1]:
            if stream_key(old, old.restart_count) not in self.lines.finished:
                await self._drain(old)
                if stream_key(old, old.restart_count) not in self.lines.finished:
                    # lines in order: the new pod's wait until the old one is read or gone, held
                    await self.read.may_read()
                    self._prefetch_newest(newest)
                    return
        if newest.deleting:  # restart in progress, replacement not listed yet
            await self._drain(newest)
            await self.discovery.wait_change(1.0)
            return
        await self._follow(newest)

    def _unseen_before(self, pod: PodInfo) -> None:
        """`pod` is seen for the first time: the restart attempts before it that lived and
        ended unseen (unseen_attempts) are lost whole — a stream gap each, one finding."""
        blind = self.discovery.blind_since_ns
        if any(stream_uid(key) not in self.attempts for key in self.model.cursors):
            blind = None  # a resumed run: a stream read before the restart may be that attempt's
        attempts, since = unseen_attempts(self.attempts.values(), pod, blind)
        if attempts:
            self.lines.unseen_attempts(attempts, since, pod)

    # ------------------------------------------------------------------------ following
    async def _follow(self, pod: PodInfo) -> None:
        spare, self.read.spare = self.read.spare, None  # opened by the last read, if it hung
        try:
            await self._follow_pod(pod, spare)
        finally:
            if spare is not None:
                await spare.stop()  # not taken: another read came first

    async def _follow_pod(self, pod: PodInfo, spare: SpareRead | None) -> None:
        reopen, self._reopen = self._reopen, None
        resumed, self._resumed = self._resumed, set()  # the first read after a resume only
        verify = None
        key = stream_key(pod, pod.restart_count)
        if (reopen == key or key in resumed) and self.read.container_runs(pod):
            # A re-read of the stream we were reading: opened first, the pod read beside it (a
            # slow API made pod-then-log 6.3 s in series, and a rotation took the lines). A
            # container restarted meanwhile is caught by the pod read or the re-read's first line.
            verify = asyncio.create_task(self.discovery.get_pod(pod.name))
            # its failure is the stream's to report (it fails too), never an unretrieved exception
            verify.add_done_callback(lambda t: t.cancelled() or t.exception())
        else:
            # A fresh read of the pod, not the watch's view (stale after a watch failure): a stream
            # opened with an old restartCount would file the new container's lines under the old one.
            try:
                fresh = await self.discovery.get_pod(pod.name)
            except Exception as exc:  # noqa: BLE001 - e.g. auth lapse: report, back off, retry
                await self._report(*reason_of(exc), retry_after=retry_after(exc))
                return
            if fresh is None or fresh.uid != pod.uid:
                await self._drain(pod, gone=True)
                return
            pod = self.known[pod.uid] = fresh
            if not await self._catch_up_previous(pod):
                return
        key = stream_key(pod, pod.restart_count)
        if pod.state == "waiting":
            self._set_state(f"pending: {pod.reason}", pod)
            await self.discovery.wait_change(1.0)
            return
        if key in self.lines.finished:
            if self.cfg.until_done and pod.reason == "Completed":
                await self._finish(pod)
                return
            self._set_state(f"container {pod.reason or 'ended'}; waiting", pod)
            await self.discovery.wait_change(1.0)
            return
        if pod.state == "terminated":
            # The container ended with its log not read to the end (a stream hung on a rotated
            # file, then the container exited): one non-follow read from the cursor. A follow is
            # cut off after 1 s of quiet once the container ended, before a slow or throttled API
            # answered it, and was opened again, forever (seed 1001: 25 steps lost, unflagged).
            await self._drain(pod)
            return
        if self._prefetch is not None and not await self._feed_prefetched(pod, key):
            return
        try:
            outcome, code, err = await self.read.follow(pod, key, verify, spare)
        finally:
            if verify is not None and not verify.done():
                verify.cancel()
        if code == 0:
            self.health.ok()
        if outcome == "oversized":
            await self._oversized(pod, key, err)
            return
        if outcome == "moved":
            return  # the next pass reads the old container's rest with --previous, then the new one
        if outcome == "paused":
            await self._wait_for_room()
            return  # the next pass re-opens the stream from the cursor
        if outcome == "silent":
            self.health.ok()  # the stream opened: whatever failed before works again
            self._reconnected(key, "silence")
            self._reopen = key
            return
        if code == 0:
            if time.monotonic() - self.read.started < 1.0:
                await asyncio.sleep(0.5)  # a server that ends every stream at once: no busy loop
            fresh = await self._fresh(pod)
            if fresh is None or (fresh.restart_count == pod.restart_count and fresh.state == "terminated"):
                # The container ended. An EOF does not prove the log was read to its end (a stream
                # hung on a rotated file ends too): one non-follow read from the cursor settles it.
                await self._drain(fresh or pod, gone=fresh is None)
                if fresh is not None and key in self.lines.finished:
                    self.known[fresh.uid] = fresh
                    if self.cfg.until_done and fresh.reason == "Completed" and not fresh.deleting:
                        await self._finish(fresh)
            elif fresh.restart_count == pod.restart_count:
                self._reconnected(key, "eof")  # EOF while running: idle timeout, apiserver restart
                self._reopen = key
            return
        await self._failed(pod, key, code, err)

    def _prefetch_newest(self, pod: PodInfo) -> None:
        """Read the newest pod now, its lines held (collector.live.prefetch) until the older pod
        is done: a first read of a running container only (a re-read goes from the cursor)."""
        key = stream_key(pod, pod.restart_count)
        if self._prefetch is not None:
            if self._prefetch.key == key:
                return
            self._prefetch.cancel()  # another container by now: its own read begins when its turn comes
            self._prefetch = None
        if pod.state != "running" or pod.deleting or key in self.lines.finished or key in self.model.cursors:
            return
        log.info("%s: reading pod %s while %s", self.run, pod.name, "an older pod is drained")
        argv = self.target.logs_argv(pod.name, pod.container, follow=True)
        self._prefetch = Prefetch(key, argv, self.read.env)

    async def _feed_prefetched(self, pod: PodInfo, key: str) -> bool:
        """The lines read ahead of `pod` (its stream `key`) into the model, as a first read;
        False when they turned out to be another container's (dropped: read again)."""
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is None:
            return True
        lines = await prefetch.take()
        if prefetch.key != key or not lines:
            return True
        if not await self.read.same_container(pod):  # opened just as the container restarted: not ours
            return False
        since, skipping = self.lines.read_since(key)
        check = self.lines.check_for(key, since, pod, skipping)
        self._reading(pod)
        for line in lines:
            self.lines.feed(line, line_ts(line), key, check)
        log.info("%s: %d lines of pod %s read while the older pod was drained, recorded now",
                 self.run, len(lines), pod.name)
        return True

    async def _wait_for_room(self) -> None:
        """Read nothing more until a commit makes room in the sink (RunSink.full): the lines
        wait in the pod's log."""
        self._set_state("paused: store away, buffer full")
        while self.sink.lost is None and self.sink.full(self.model):
            await asyncio.sleep(0.5)

    def _reconnected(self, stream: str, reason: str) -> None:
        self.status.reconnects += 1
        self.detectors.reconnect(reason)
        self.sink.add_reconnect(stream, reason)

    # ------------------------------------------------------------------------ draining
    async def _drain(self, pod: PodInfo, gone: bool = False) -> None:
        """Read what an old (replaced, deleting) pod holds after the last line read."""
        key = stream_key(pod, pod.restart_count)
        if self._prefetch is not None and self._prefetch.key == key:  # read whole here instead
            self._prefetch.cancel()
            self._prefetch = None
        if gone:
            self.gone.add(pod.uid)
        if key in self.lines.finished:
            return  # read to its end, or its gap recorded, already
        if pod.state == "waiting" and key not in self.model.cursors:
            self.lines.read_to_end(key)  # it never ran: nothing to read
            return
        if not await self._catch_up_previous(pod) and not gone:
            return
        self._set_state("draining old pod", pod)
        cursor = self.model.cursors.get(key)
        newest, read_at = None, 0
        if not gone and cursor is not None:
            # The pod's newest line, asked beside the read (one round trip, not two in series):
            # unread and stamped before where the read starts, the node clock stepped back since
            # the last line read and --since-time filtered out the lines after the step: read
            # again, reaching back to it (Cursor.seen; seed 402). A deleting pod too: its log
            # is served until the grace period ends (seed 1185).
            newest = asyncio.create_task(self.read.newest_line(pod))
            read_at = cursor.read_at_ns
        try:
            code, err, since, check = await self._drain_reads(pod, key, cursor, newest, read_at)
        finally:
            if newest is not None:
                newest.cancel()
        if code == kubectl.OVERSIZED:
            await self._oversized(pod, key, err)
            return
        if code == 0:
            self.health.ok()
            self.lines.read_ended(key, check, pod.name, _upper(pod.finished_ns))
            return
        kind, reason = kubectl.classify(err) if code is not None else ("timeout", err)
        if kind == kubectl.NOT_FOUND or gone:
            self.lines.unread_tail(key, pod.name, since, _upper(pod.finished_ns),
                              f"pod {pod.name} deleted before its log was read to the end ({reason})")
            self.known.pop(pod.uid, None)
            return
        await self._report(kind, f"draining {pod.name}: {reason}")

    async def _drain_reads(self, pod: PodInfo, key: str, cursor: Cursor | None, newest: asyncio.Task | None,
                           read_at: int) -> tuple[int | None, str, int | None, Overlap]:
        """The drain's read from the cursor (kubectl's exit code, its error, where the read
        started, its overlap check); read again from the pod's newest line (`newest`, asked beside it) when the
        first read missed it, stamped before the read's start."""
        while True:
            since, skipping = self.lines.read_since(key)
            check = self.lines.check_for(key, since, pod, skipping)
            self._reading(pod)
            argv = self.target.logs_argv(pod.name, pod.container, since_ns=since)
            code, err = await self.read.read_once(argv, key, check)
            if newest is None:
                return code, err, since, check
            line, newest = await newest, None
            if code != 0 or not line or since is None or cursor.seen(line_ts(line), line, read_at):
                return code, err, since, check  # read again only when the clock stepped back behind it
            if cursor.since_ns is None or cursor.since_ns >= since:
                return code, err, since, check

    async def _catch_up_previous(self, pod: PodInfo) -> bool:
        """After an in-place restart, read the rest of the container we were following.
        False while that is not done (the new container must wait: lines stay in order)."""
        prefix = f"{pod.uid}/{pod.container}/"
        seen = [int(k[len(prefix):]) for k in self.model.cursors if k.startswith(prefix)]
        older = [rc for rc in seen if rc < pod.restart_count and f"{prefix}{rc}" not in self.lines.finished]
        if not seen and pod.restart_count > 0 and f"{prefix}{pod.restart_count - 1}" not in self.lines.finished:
            older = [pod.restart_count - 1]  # first sight of a restarted pod: its previous container first
        if not older:
            return True
        rc = max(older)
        key = f"{prefix}{rc}"
        since, skipping = self.lines.read_since(key)
        if rc != pod.restart_count - 1:
            # the container we read restarted more than once since: --previous is a later one
            self.lines.gap(key, since, _upper(pod.previous_finished_ns),
                      f"container restarted {pod.restart_count - rc} times between reads")
            self.lines.read_to_end(key)
            return True
        # --previous serves the container before the current one: its start is lastState's
        check = self.lines.check_for(key, since, None, skipping, started_ns=pod.previous_started_ns)
        argv = self.target.logs_argv(pod.name, pod.container, previous=True, since_ns=since)
        self._set_state("reading previous container", pod)
        code, err = await self.read.read_once(argv, key, check)
        if code == kubectl.OVERSIZED:
            await self._oversized(pod, key, err, previous=True)
            return False
        if code == 0:
            self.health.ok()
            self.lines.read_ended(key, check, pod.name, _upper(pod.previous_finished_ns))
            return True
        kind, reason = kubectl.classify(err) if code is not None else ("timeout", err)
        if kind in (kubectl.NOT_FOUND, kubectl.NO_PREVIOUS):
            self.lines.gap(key, since, _upper(pod.previous_finished_ns), f"previous container unreadable: {reason}")
            self.lines.read_to_end(key)
            return True
        await self._report(kind, f"reading --previous of {pod.name}: {reason}")
        return False

    async def _oversized(self, pod: PodInfo, key: str, why: str, previous: bool = False) -> None:
        """A read stopped inside a line with no end: the next read starts after it. Its
        start is learnt from a read of the first MiB from the cursor (limitBytes; a re-read
        starts up to a second early). The API's sinceTime has whole seconds, so the rest of
        that second is skipped too: a stream gap, a bad line, a failure (logged, counted, a
        finding) that clears with the next line read."""
        since, _ = self.lines.read_since(key)
        start: list[int | None] = [None]

        def see(line: bytes) -> None:
            if not line.endswith(b"\n"):  # cut off by limitBytes: the line with no end
                start[0] = line_ts(line)

        argv = self.target.logs_argv(pod.name, pod.container, since_ns=since, previous=previous,
                                     limit_bytes=1 << 20)
        try:
            await self.read.may_read()
            await kubectl.run_once(argv, self.read.env, see, self.cfg.drain_timeout)
        except Exception as exc:  # noqa: BLE001 - unknown start: skip from the cursor
            log.debug("%s: start of the line with no end unknown: %s", self.run, exc)
        base = start[0] or since or time.time_ns()
        skip_to = (base // 1_000_000_000 + 1) * 1_000_000_000
        reason = (f"a line with no end from {format_ns(base)}: {why}; the read stopped, the log read again "
                  f"from {format_ns(skip_to)}")
        self.model.bad_line(reason)
        self.lines.gap(key, base, skip_to, reason)
        self.lines.skip[key] = skip_to
        await self._report("line_too_long", reason)

    # ------------------------------------------------------------------------ lines

    # ------------------------------------------------------------------------ failures
    async def _failed(self, pod: PodInfo, key: str, code: int | None, err: str) -> None:
        kind, reason = kubectl.classify(err)
        if kind == kubectl.CONTAINER_CREATING:
            self._set_state(f"pending: {reason}", pod)
            await self.discovery.wait_change(1.0)
            return
        if kind == kubectl.NOT_FOUND:
            fresh = await self._fresh(pod)
            if fresh is None:  # the pod is gone: what it held after our last line is lost
                self.gone.add(pod.uid)
                self.lines.unread_tail(key, pod.name, self.lines.since(key), _upper(pod.finished_ns),  # the read ends
                                  f"pod {pod.name} deleted before its log was read to the end ({reason})")
                self.known.pop(pod.uid, None)
                return
        if kind in (kubectl.SERVER_ERROR, kubectl.NETWORK, kubectl.AUTH):
            self._reopen = key  # the API's failure, not the pod's: the retry goes straight to the log
        await self._report(kind, reason)

    def _failure_heard(self, kind: str, reason: str) -> None:
        """A failure of this run's reads (the supervisor's too, on the same Health): the run's
        detectors hear it, and, unless it is a line skipped, it is the cause of what the next
        read finds lost."""
        if kind != "line_too_long":
            self.lines.cause = (kind, reason)
        self.detectors.failure(kind, reason)

    async def _report(self, kind: str, reason: str, retry_after: float | None = None) -> None:
        """One failure: counted, its cause kept, then the back-off — the wait a throttled answer
        named (Retry-After; kubectl's 429 after its own retries: kubectl.THROTTLED_WAIT_S), never
        our doubling on top of it."""
        if retry_after is None:
            retry_after = kubectl.throttled_wait(reason)
        self.health.fail(kind, reason, retry_after=retry_after)  # counted; logged when it starts or changes kind
        if kind == "line_too_long" and (book := self.detectors.collector_events) is not None:
            # the stretch skipped is its own stream gap, recorded with this reason: the event it
            # opened lost steps should a gap finding name it
            self.detectors.caused(reason, book.latest(self.run))
        self._set_state(f"failing ({kind})")
        await self._back_off(self.health.backoff(self._retry_cap()))

    def _retry_cap(self) -> float:
        """The longest back-off now: RUNNING_RETRY_S while a process-0 container of this run
        runs with its log not read to the end (its lines can rotate away), else backoff_max."""
        for p in self.discovery.process0(self.jobset):
            if p.state == "running" and stream_key(p, p.restart_count) not in self.lines.finished:
                return min(RUNNING_RETRY_S, self.cfg.backoff_max)
        return self.cfg.backoff_max

    async def _back_off(self, delay: float) -> None:
        """Wait before a retry, but not past a recovery (any source talking to the cluster
        working again: collector.notify.health.Recovery), and not long while a process-0 pod of
        this JobSet is being deleted with its log not read to the end: its grace period is all
        the time left to read it. The wait ends when discovery first shows such a pod, and
        while one remains no wait is longer than DELETING_RETRY_S."""
        start = time.monotonic()
        deadline = start + delay
        generation = self.recovery.generation
        while (left := deadline - time.monotonic()) > 0:
            if self.recovery.generation != generation and not self.health.told_to_wait:
                log.debug("%s: the cluster answers again: retrying now, not after the back-off", self.run)
                return
            for p in self.discovery.process0(self.jobset):
                if p.deleting and stream_key(p, p.restart_count) not in self.lines.finished:
                    if p.uid not in self._hurried:
                        self._hurried.add(p.uid)
                        log.info("%s: pod %s is being deleted: reading it now, not after the back-off",
                                 self.run, p.name)
                        return
                    deadline = min(deadline, start + DELETING_RETRY_S)
            if (left := deadline - time.monotonic()) > 0:
                await self.discovery.wait_change(left)

    async def _fresh(self, pod: PodInfo) -> PodInfo | None:
        try:
            return await self.discovery.get_pod(pod.name)
        except Exception:  # noqa: BLE001 - fall back to the watch's view
            return self.discovery.pods.get(pod.uid)

    def _set_state(self, state: str, pod: PodInfo | None = None) -> None:
        self.status.set_state(state, pod.name if pod is not None else None)
        if state != "following":  # stalls are judged only while a stream delivers (StreamReader.follow sets it)
            self.sink.delivering(False)
        if state == "following":
            self.status.last_error = None if self.health.failing is None else self.status.last_error

    # ------------------------------------------------------------------------ committing
    async def _pause_watch(self) -> None:
        """Its own task, doing nothing but sleep: the flush loop spends most of its time in a
        commit, and a stop that fell inside one went unseen (CI, 2026-12-06)."""
        while True:
            before = time.monotonic()
            await asyncio.sleep(PAUSE_LOOK_S)
            late = time.monotonic() - before - PAUSE_LOOK_S
            if late >= PAUSE_S:  # the loop's clock jumped: this process was stopped or starved
                self.pauses += 1
                self.detectors.paused()
                log.warning("%s: the collector was not running for %.1f s (stopped or starved): that time "
                            "is not judged as the trainer's", self.run, late)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.flush_interval)
            now = time.monotonic()
            looked = None if self.read.heard is None else time.time_ns() - int((now - self.read.heard) * 1e9)
            self.detectors.heard(looked, self.read.heard_stamp)
            # shielded: a commit in flight at shutdown completes before the final flush
            await asyncio.shield(self._flush())

    async def _flush(self, parquet: bool = False) -> None:
        rows = await self.sink.flush(self.model, parquet=parquet)
        self.status.rows += rows
        self._update_view()

    async def final_flush(self) -> None:
        await self._flush(parquet=True)
        await self.sink.close_raw()  # segments closed, their sha256 recorded

    async def _finish(self, pod: PodInfo) -> None:
        """Process 0 completed: end-of-data checks, everything committed, done."""
        self.model.settle()  # the log ended: a step still held back has no step after it (as ingest)
        self.detectors.finish()
        await self.final_flush()
        self.status.done = True
        self._set_state("done", pod)

    def _update_view(self) -> None:
        st, sink = self.status, self.sink
        if sink.last_loss is not None:
            row = sink.last_loss
            st.last_incarnation, st.last_step = row[LOSS_PARTS.INCARNATION], row[LOSS_PARTS.STEP]
            st.last_ce = row[LOSS_PARTS.CE]
            if sink.step_seconds is not None:
                st.step_seconds = sink.step_seconds
        st.steps = sink.committed_steps
        if sink.error:
            st.last_error = sink.error
