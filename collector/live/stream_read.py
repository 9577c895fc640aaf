"""Reading one run's streams: how, not what or when (that is collector.live.follower's policy).

A follow read of one stream into the run's lines (collector.live.stream_lines), with its
watchdog: a stream quieter than its own pace (collector.live.watchdog) is looked at — the pod's
newest line, one small non-follow read — with its re-read opened beside the look
(collector.live.spare); the read ends "silent" when the look shows the stream hung on a
rotated file, "moved" when the pod runs another container than the one read, "paused" when the
sink is full, "oversized" on a line with no end. Also: a non-follow read (a drain), the pod's
newest line, whether a container is still the one read.

What the reads learn is kept here for the follower: the spare left by a hung read, when the
trainer was last heard (a look that found nothing unread, the stamp of the latest line fed),
how long the API takes to answer now."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from steptail.collector.cluster import kubectl
from steptail.collector.cluster.discovery import Discovery, PodInfo, retry_after
from steptail.collector.cluster.kubectl import KubeTarget
from steptail.collector.live.overlap import Overlap
from steptail.collector.live.read_gate import ReadGate
from steptail.collector.live.sink import RunSink
from steptail.collector.live.spare import SpareRead
from steptail.collector.live.stream_lines import StreamLines
from steptail.collector.live.watchdog import Watchdog
from steptail.collector.notify.health import Recovery
from steptail.parsers.fast import line_ts
from steptail.runs.model import RunModel

log = logging.getLogger("steptail.follow")

# A read is one request (collector.cluster.kubectl: the raw log read): a stream that delivered
# nothing yet is not judged hung before that much time, at the API's latest pace
OPEN_REQUESTS = 1


class StreamReader:
    def __init__(self, run: str, target: KubeTarget, discovery: Discovery, model: RunModel, sink: RunSink,
                 lines: StreamLines, cfg, recovery: Recovery, known: dict[str, PodInfo],
                 reading: Callable[[PodInfo], None], set_state: Callable[..., None],
                 read_gate: ReadGate | None = None) -> None:
        self.run, self.target, self.discovery = run, target, discovery
        self.model, self.sink, self.lines, self.cfg = model, sink, lines, cfg  # cfg: follower.FollowConfig
        self.recovery = recovery  # one health for everything that talks to the cluster
        self.known = known  # the follower's pods by uid: a pod read beside a re-read updates it
        self.reading = reading  # the model files what follows under this pod
        self.set_state = set_state
        # with replicas: after a pause of this process, no new read before its ownership is known
        self.read_gate = read_gate
        self.env = target.env()
        self.started = 0.0  # monotonic time the latest follow read was opened
        self.spare: SpareRead | None = None  # the re-read opened beside a look at a hung stream
        self.probes = 0  # non-follow reads of a quiet pod's newest line
        self.round_trip = 0.0  # seconds the latest probe took: the API's pace now
        self.look_wait: float | None = None  # the Retry-After of the latest look refused, if it named one
        # What bounds the stall clock (it counts quiet up to it only): the monotonic time of the
        # latest look that found nothing unread, and the stamp of the latest line fed. A line
        # vouches for the trainer up to its own stamp, not up to when it arrived: a re-read's
        # backlog arrives late, and its arrival is no quiet of the trainer's.
        self.heard: float | None = None
        self.heard_stamp: int | None = None

    def _moved(self, pod: PodInfo, verify: asyncio.Task | None) -> bool:
        """The pod read beside a re-read (`verify`) shows another container than the one read:
        the stream stops, the next pass reads the pod afresh (a failed read proves nothing)."""
        if verify is None or not verify.done() or verify.cancelled() or verify.exception() is not None:
            return False
        fresh = verify.result()
        if fresh is None or fresh.uid != pod.uid:
            return False  # gone: the stream ends by itself, and the next pass drains what is left
        self.known[pod.uid] = fresh
        return fresh.restart_count != pod.restart_count

    async def follow(self, pod: PodInfo, key: str, verify: asyncio.Task | None = None,
                     spare: SpareRead | None = None) -> tuple[str, int | None, str]:
        """One follow read; returns (outcome, exit code, stderr or why): eof or exit (kubectl
        ended), silent (hung, re-open), moved (another container), paused (the sink is full),
        oversized (a line with no end). `verify`: a read of the pod begun beside a re-read
        (RunFollower._follow_pod); `spare`: the re-read opened beside the look that found the
        last read hung (collector.live.spare)."""
        argv, since, skipping = self.follow_argv(pod, key)
        self.reading(pod)
        self.set_state("following", pod)
        await self.may_read()
        self.started = time.monotonic()
        proc = (spare and spare.take(argv)) or await kubectl.spawn(argv, self.env)
        long = kubectl.LongLine(self.cfg.max_line_bytes)
        err_task = asyncio.create_task(proc.stderr.read())
        check = self.lines.check_for(key, since, pod, skipping)
        outcome, why = "eof", ""
        last_line = time.monotonic()
        delivered = False  # a line came on this stream (kubectl was answered)
        refused_at = self.recovery.generation  # recoveries seen when a look at the pod last failed
        # a first read of the stream: nothing to compare its first line with, so the pod is
        # asked once whether the container is still the one the stream was opened for
        unverified = self.lines.mark_since(key) is None
        watchdog = Watchdog(self.lines.pace, self.cfg.silence)
        probe: asyncio.Task | None = None
        ahead: SpareRead | None = None  # the re-read opened beside the look, kept if the stream hangs
        try:
            while True:
                try:
                    # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel that
                    # meets a completed read, and the follower would outlive its shutdown
                    async with asyncio.timeout(0.25):
                        line = await proc.stdout.readline()
                except TimeoutError:
                    quiet = time.monotonic() - last_line
                    if ahead is not None and probe is None:  # the look found no hang
                        await ahead.stop()
                        ahead = None
                    if self._moved(pod, verify):
                        outcome = "moved"
                        break
                    if watchdog.refused and self.recovery.generation != refused_at:
                        watchdog.next_check = quiet  # the cluster answers again: look now
                    if not self.container_runs(pod):
                        if quiet >= 1.0:  # the container ended: do not wait for a slow EOF
                            outcome = "silent"
                            break
                        continue
                    if probe is None and quiet >= watchdog.next_check:
                        probe = asyncio.create_task(self._pod_has_unread(pod, key, delivered))
                        probe_line, probe_at = last_line, time.monotonic()
                        if delivered and not self.paused():  # it may hang: its re-read goes out now
                            ahead = await SpareRead.open(self.follow_argv(pod, key)[0], self.env)
                    if probe is None or not probe.done():
                        continue
                    unread, probe = probe.result(), None
                    self.round_trip = time.monotonic() - probe_at
                    if probe_line != last_line:
                        continue  # lines arrived meanwhile: the stream lives
                    opening = watchdog.threshold() + OPEN_REQUESTS * self.round_trip
                    if unread and not delivered and quiet < opening:
                        # not answered yet under a slow API: killing it would only start over
                        watchdog.next_check = opening
                        continue
                    if unread or (unread is None and quiet >= self.cfg.silence):
                        outcome = "silent"  # hung (or unknowable for too long): re-open
                        self.spare, ahead = ahead, None
                        break
                    if unread is None and self.look_wait is not None and delivered:
                        # The look was throttled (429, Retry-After) at a stream quiet past its pace:
                        # re-read now rather than look again after the wait and re-read after that
                        # (chaos seed 1001: nine 429s cost a look and a back-off each, 15 s).
                        # kubectl waits out Retry-After by itself, the pod is read beside it
                        # (_follow), and a quiet stream that was not hung costs one reconnect.
                        outcome = "silent"
                        self.spare, ahead = ahead, None
                        break
                    if unread is None:  # the pod could not be asked: ask again soon, vouch for nothing
                        watchdog.unknown(quiet, self.look_wait)
                        refused_at = self.recovery.generation
                        continue
                    watchdog.quiet_confirmed(quiet)
                    self.heard = max(self.heard or probe_at, probe_at)  # the quiet is the trainer's
                    continue
                except ValueError:  # over the reader's limit: the rest of it arrives as a fragment
                    if long.grew():  # a line with no end: what follows only continues it
                        outcome, why = "oversized", long.why
                        break
                    if long.first:
                        self.model.bad_line("line longer than 2 MiB")
                    continue
                if not line:
                    break
                tail = long.bytes > 0  # the end of an over-long line, or a line after it
                long.ended()
                last_line = time.monotonic()
                if ahead is not None and (probe is None or probe.done()):  # the stream lives: no re-read
                    await ahead.stop()
                    ahead = None
                if not delivered:
                    delivered = True
                    self.recovery.answered()  # kubectl was answered: every other wait ends
                self.sink.delivering(True)
                watchdog.reset()
                ts_ns = line_ts(line)
                if tail and ts_ns is None:
                    continue  # the over-long line's end, not a line of its own
                if self._moved(pod, verify) or (
                        (unverified or check.would_gap(ts_ns)) and not await self.same_container(pod)):
                    outcome = "moved"  # opened just as the container restarted: those lines are not ours
                    break
                unverified = False
                self.lines.feed(line, ts_ns, key, check)
                if ts_ns is not None:  # after the feed: its step (if any) is the detectors' first
                    self.heard_stamp = ts_ns
                if self.sink.full(self.model):  # the store is away and the buffer at its bound
                    outcome = "paused"
                    break
        finally:
            if probe is not None:
                probe.cancel()
            if ahead is not None:
                await ahead.stop()
            await kubectl.stop(proc)  # by PID, on every exit path (cancel included)
        err = ""
        if err_task.done() or outcome != "silent":
            try:  # a cancel of this task must propagate: only the timeout is ours to absorb
                async with asyncio.timeout(1.0):
                    err = (await err_task).decode("utf-8", "replace")
            except TimeoutError:
                err = ""
        if not err_task.done():
            err_task.cancel()
        if outcome in ("silent", "moved", "paused", "oversized"):
            return outcome, None, why
        return ("eof" if proc.returncode == 0 else "exit"), proc.returncode, err

    async def may_read(self) -> None:
        """Before any new read of a pod (collector.live.read_gate)."""
        if self.read_gate is not None:
            await self.read_gate.wait()

    def paused(self) -> bool:
        return self.read_gate is not None and self.read_gate.closed

    def container_runs(self, pod: PodInfo) -> bool:
        cur = self.discovery.pods.get(pod.uid)
        return not (cur is None or cur.deleting or cur.restart_count != pod.restart_count
                    or cur.state != "running")

    async def _pod_has_unread(self, pod: PodInfo, key: str, delivered: bool) -> bool | None:
        """Whether the pod's newest log line is one this stream has not delivered (the stream
        hangs on a rotated file); None when the pod cannot be asked. `delivered`: the stream
        delivered a line before the look."""
        newest = await self.newest_line(pod)
        if newest == b"" and delivered:
            # The current file is empty, yet this stream delivered lines: they were in a file
            # rotated since, and kubelet sends nothing more on it. Hung, though nothing is unread
            # yet: re-read now, on the new file, and its first lines come as they are written
            # (seed 1185: a quiet trainer's next lines waited one more look, 9 s, and a rotation
            # right after them would have taken them).
            return True
        if not newest:
            # Unknowable, or the current file is empty and this stream delivered nothing: it may
            # hang on the file before it. Unknown, not quiet: asked again soon (a quiet confirmed
            # doubles the wait, and the next rotation took the lines written meanwhile: seed 402).
            return None
        cursor = self.model.cursors.get(key)
        return cursor is None or not cursor.seen(line_ts(newest), newest)

    async def newest_line(self, pod: PodInfo) -> bytes | None:
        """The pod's newest log line (b"" for an empty file), None when it cannot be asked."""
        await self.may_read()
        self.probes += 1
        self.look_wait = None
        try:
            newest = await self.discovery.last_log_line(pod.name, pod.container)
        except Exception as exc:  # noqa: BLE001 - unknowable: the caller falls back to --silence
            log.debug("%s: probe of %s failed: %s", self.run, pod.name, exc)
            self.look_wait = retry_after(exc)  # the server said when to ask again: then, not later
            return None
        return newest.rstrip(b"\r\n").rpartition(b"\n")[2]

    async def read_once(self, argv: list[str], key: str, check: Overlap) -> tuple[int | None, str]:
        """A non-follow read of one stream into the model (kubectl.run_once)."""
        await self.may_read()
        def overlong() -> None:
            self.model.bad_line("line longer than 2 MiB")

        return await kubectl.run_once(argv, self.env, lambda ln: self.lines.feed(ln, line_ts(ln), key, check),
                                      self.cfg.drain_timeout, max_line=self.cfg.max_line_bytes,
                                      on_overlong=overlong)

    def follow_argv(self, pod: PodInfo, key: str) -> tuple[list[str], int | None, bool]:
        """The follow read of the stream from where it is to be read (_read_since)."""
        since, skipping = self.lines.read_since(key)
        return self.target.logs_argv(pod.name, pod.container, follow=True, since_ns=since), since, skipping

    async def same_container(self, pod: PodInfo) -> bool:
        """Whether the container we meant to read is still the pod's current one. A log read
        names no container instance: a stream opened just after an in-place restart serves the
        new container. Asked at the first line of a stream's first read (a restart between the
        pod read and the stream's opening would file the new container's lines as the old
        one's, and the old one would never be read) and when a re-read would otherwise record
        a gap. The stream was resolved before its first line came: a pod still at the same
        restartCount after that line proves the line the old container's."""
        try:
            fresh = await self.discovery.get_pod(pod.name)
        except Exception:  # noqa: BLE001 - cannot tell: keep reading, a gap gets recorded
            return True
        return fresh is not None and fresh.uid == pod.uid and fresh.restart_count == pod.restart_count
