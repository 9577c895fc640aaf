"""What a run's streams deliver, line by line: each line through its read's overlap check
(collector.live.overlap) into the run model, the stream gaps a read finds or a lost pod leaves,
the streams read to their end, and where each stream's next read starts.

The follower (collector.live.follower) decides which pod to read and when, and reads it; every
line it reads comes here. Nothing here talks to the cluster."""

from __future__ import annotations

import logging
import re
import time

from steptail.collector.cluster.discovery import PodInfo
from steptail.collector.live.detect import Detectors
from steptail.collector.live.overlap import Overlap
from steptail.collector.live.sink import RunSink
from steptail.collector.live.watchdog import Pace
from steptail.collector.notify.health import Health
from steptail.parsers.timestamps import format_ns
from steptail.runs.findings import UNREAD_TAIL, UNREADABLE_LOG
from steptail.runs.model import POD_STREAM, RunModel
from steptail.runs.stream_gap import StreamGap, unseen_attempt_stream

log = logging.getLogger("steptail.follow")

# A follower failure as the cause on the gap it left (collector.cluster.kubectl.classify's
# and reason_of's kinds); any other: "could not read the log (<kind>)".
CAUSES = {
    "auth": "could not authenticate",
    "forbidden": "was denied access (403)",
    "server_error": "got server errors from the Kubernetes API",
    "network": "could not reach the Kubernetes API",
}
# Bytes no text line holds (tab, CR and ESC of colours and progress bars are fine).
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]")


def stream_key(pod: PodInfo, restart_count: int) -> str:
    """A container's log, as the cursors and stream gaps name it: pod uid / container / restart."""
    return f"{pod.uid}/{pod.container}/{restart_count}"


def stream_uid(key: str) -> str:
    """The pod uid a stream key (stream_key) names."""
    return key.split("/", 1)[0]


def readable(line: bytes) -> bool:
    """Whether a line is text steptail could read: UTF-8 without control bytes."""
    if _CONTROL.search(line) is not None:
        return False
    if line.isascii():
        return True
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class StreamLines:
    def __init__(self, run: str, model: RunModel, sink: RunSink, detectors: Detectors, status,
                 health: Health, unreadable_after: float) -> None:
        self.run, self.model, self.sink, self.detectors, self.status = run, model, sink, detectors, status
        self.health = health  # the run's reads: a line delivered ends their failure
        self.unreadable_after = unreadable_after
        # what process 0 prints: failing while a stream delivers only lines no parser can read
        self.content = Health("stream content", run, detectors.metrics, status)
        self.content.subscribe("follower", lambda kind, reason: detectors.failure(UNREADABLE_LOG, reason),
                               each=False)
        self.content.events = self.content.events or detectors.collector_events
        # streams read to their end (saved with the cursors: known again after a restart)
        self.finished: set[str] = {k for k, c in model.cursors.items() if c.done}
        self.skip: dict[str, int] = {}  # stream -> read from here: a line with no end before it
        self._pending_check: dict[str, Overlap] = {}  # stream -> unresolved re-read check
        # stream -> the latest gap a re-read found in it, and where the run was then (the
        # incarnation, its last step): a container that ends with no step read after that gap
        # lost its tail in it (chaos seed 106)
        self._gap_before: dict[str, tuple[object, int | None, str]] = {}
        # the latest failure that kept the follower from reading (kind, reason), until a read
        # shows whether lines were lost meanwhile: the stream gap it finds then names it as cause
        self.cause: tuple[str, str] | None = None
        # the window being judged while unreadable lines come: [monotonic start, unreadable lines,
        # their bytes, readable lines]; None while everything reads
        self._unreadable: list | None = None
        self.pace = Pace()  # the writer's pace, for the hang watchdog
        self.raw = sink.raw  # follow --raw: the lines as read

    def vanished_while_away(self, listed: set[str]) -> None:
        """Streams this run was reading when the collector stopped, whose pods (not among the
        uids `listed` now) were deleted
        before it came back (a JobSet restart with a short grace): what they held after the
        last line read is lost — a stream gap and an unread_tail finding, never silence."""
        # the pod that was being read is the current incarnation's (lines are read in order)
        name = self.model.current.pod if self.model.current is not None else None
        for key, cursor in sorted(self.model.cursors.items()):
            uid = stream_uid(key)
            if key in self.finished or uid in listed or not POD_STREAM.fullmatch(key):
                continue
            pod = f"pod {name} (uid {uid})" if name else f"the pod with uid {uid}"
            reason = f"{pod} was deleted while the collector was down: its log after the last line read is lost"
            self.unread_tail(key, name, cursor.hwm_ns, None, reason)

    def unread_tail(self, key: str, pod: str | None, start_ns: int | None, end_ns: int | None,
                     reason: str) -> None:
        """A stream whose pod went before its log was read to the end: what it held after the
        last line read is lost. A stream gap over that window, and an unread_tail finding
        placed after the last step read from the stream (the steps lost after it are unknown
        by number, so not counted as missing steps; they are lost all the same); the stream is
        done."""
        reason = self.gap(key, start_ns, end_ns, reason, caused=True)
        cur = self.model.current
        # the incarnation the stream's lines went to: the model's current one when that is
        # this pod's (lines are read in order: a deleted pod is read before its replacement)
        read = self.model.cursors.get(key)
        at = None
        if read is not None and read.hwm_ns is not None and cur is not None and cur.pod == pod:
            at = (cur.number, cur.last_step)
        window = (f"lines from {format_ns(start_ns) if start_ns else 'its start'} to "
                  f"{format_ns(end_ns) if end_ns else 'its end'} lost")
        self.detectors.failure(UNREAD_TAIL, f"{reason}: {window}", at)
        self.cause = None
        self.read_to_end(key)

    def unseen_attempts(self, attempts: range, since_ns: int | None, pod: PodInfo) -> None:
        """Restart attempts of the JobSet that lived and ended unseen before `pod`'s (its first
        sight): their logs are lost whole, unknown by step — a stream gap each, from `since_ns`
        to `pod`'s creation, and one unread_tail finding after the last step read."""
        which = (f"restart attempt {attempts[0]}" if len(attempts) == 1 else
                 f"restart attempts {attempts[0]}-{attempts[-1]}")
        reason = (f"{which} of JobSet {pod.jobset} ran and ended unseen (the next pod seen, {pod.name}, is "
                  f"attempt {pod.attempt}): whatever its process 0 wrote is lost")
        told = [self.gap(unseen_attempt_stream(a), since_ns, pod.created_ns, reason, caused=True) for a in attempts]
        cur = self.model.current
        self.detectors.failure(UNREAD_TAIL, told[-1], (cur.number, cur.last_step) if cur is not None else None)
        self.cause = None

    def read_ended(self, key: str, check: Overlap, pod: str, end_ns: int | None) -> None:
        """The last read of an ended container `pod` (stream `key`) is done, `check` its
        overlap check: the stream is read to its end, unless that read served no line at all
        (Overlap.unanswered) — then what came after the last line read is an unread tail."""
        mark = check.unanswered()
        if mark is None:
            self._tail_in_gap(key, pod)
            self.read_to_end(key)
            return
        self.unread_tail(key, pod, mark, end_ns,
                         f"the last read of pod {pod}'s ended container served no line, not even the last one "
                         "read: the file holding it was rotated away, with whatever the container wrote after it")

    def _tail_in_gap(self, key: str, pod: str) -> None:
        """The container read to its end: when the latest gap a re-read found in it came
        after its last step read (the lines served after the gap held no step: a pre-emption
        notice, the last lines of a log the reader fell behind), the steps written after that
        step went with the rotated file — an unread tail, its gap finding (no later step can
        bound it; their number is unknown), never a silent stream gap."""
        found = self._gap_before.pop(key, None)
        cur = self.model.current
        if found is None or cur is None or cur.pod != pod:
            return
        inc, last, reason = found
        if inc is cur and last is not None and cur.last_step == last:
            self.detectors.failure(UNREAD_TAIL, f"{reason}; no step was read after it before the container "
                                                "ended: the steps it wrote after that one were in the lost lines",
                                   (cur.number, last))

    def read_to_end(self, key: str) -> None:
        self.finished.add(key)
        self.model.finish_stream(key)

    def _since(self, key: str) -> int | None:
        """`--since-time` of the next read of `key`: a little before the cursor's mark, the
        stamp of the latest line read, which follows a clock stepped back (Cursor.since_ns: a
        later since would have the server filter out new lines stamped before it). Each read of
        a stream starts here, so the cursor is told a re-read begins: its first lines may
        repeat what was read (runs.cursor.Cursor)."""
        cursor = self.model.cursors.get(key)
        if cursor is None:
            return None
        cursor.new_read()
        return cursor.since_ns

    def mark_since(self, key: str) -> int | None:
        """Where a re-read of `key` would start (no read begins: the cursor is not told)."""
        cursor = self.model.cursors.get(key)
        return cursor.since_ns if cursor is not None else None

    def read_since(self, key: str) -> tuple[int | None, bool]:
        """Where a read of the stream starts: the cursor, or past a line with no end (True)."""
        since, skip = self._since(key), self.skip.get(key)
        if skip is not None and (since is None or skip > since):
            return skip, True
        return since, False

    def check_for(self, key: str, since: int | None, pod: PodInfo | None = None,
                   skipping: bool = False, started_ns: int | None = None) -> Overlap:
        """The overlap check of a read from `since`; `started_ns`: the start of the container
        read, when not the pod's current one (a head rotated away is lost from there)."""
        if skipping:  # the window skipped is a recorded gap already: nothing to check
            check = Overlap(None)
            check.resolved = True
            return check
        check = self._pending_check.get(key)
        if check is not None:
            check.asked = False  # a new read: its container is checked again
        if check is None or check.hwm_ns != since:
            if pod is not None and key == stream_key(pod, pod.restart_count):
                started_ns = pod.started_ns
            check = self._pending_check[key] = Overlap(since, started_ns, self.model.cursors.get(key),
                                                         self.model.recorded)
        return check

    def feed(self, line: bytes, ts_ns: int | None, key: str, check: Overlap) -> None:
        """One line and its kubelet timestamp (parsers.fast.line_ts), read once for the pace,
        the overlap check and the model."""
        if self.health.failing is not None:  # a read delivers: whatever failed works again
            self.health.ok()
        if not readable(line):
            self._unreadable_line(line, False)
        elif self._unreadable is not None:
            self._unreadable_line(line, True)
        self.pace.see(ts_ns)
        for start, end, reason in check.see(ts_ns, line):
            reason = self.gap(key, start, end, reason, caused=True)
            cur = self.model.current
            self._gap_before[key] = (cur, cur.last_step if cur is not None else None, reason)
        if check.resolved:
            self._pending_check.pop(key, None)
            self.cause = None  # this read shows what the failure lost, if anything
        self.model.counters.lines += 1
        self.status.lines += 1
        if self.raw is not None:  # as read: the sink writes it before the rows it makes commit
            self.raw.add(key, line, ts_ns, self.model.pod)
        self.model.feed_stamped(line, ts_ns, stream=key)

    def _unreadable_line(self, line: bytes, ok: bool) -> None:
        """A line while unreadable ones come (binary garbage, or text in an encoding steptail
        cannot read), counted in windows of `unreadable_after` seconds from the first: a window
        mostly unreadable is a failure (one warning line, the errors metric and the up gauge)
        until a window mostly readable. Judged by the majority, not by any readable line: 0.7 %
        of random byte "lines" are short valid UTF-8, and ended every spell (issue 34)."""
        now = time.monotonic()
        window = self._unreadable
        if window is None:
            window = self._unreadable = [now, 0, 0, 0]
        if ok:
            window[3] += 1
        else:
            window[1] += 1
            window[2] += len(line)
        if now - window[0] < self.unreadable_after:
            return
        if window[1] <= window[3]:  # mostly readable: the spell is over
            self._unreadable = None
            if self.content.failing is not None:
                self.content.ok()  # logs the end of a spell that was reported
            return
        if self.content.failing is None:
            reason = (f"process 0 prints nothing steptail can read: {window[1]} of {window[1] + window[3]} lines "
                      f"({window[2]} bytes) in {now - window[0]:.0f} s unreadable (binary output or an unknown "
                      "encoding)")
            self.content.fail("unreadable", reason)
        self._unreadable = [now, 0, 0, 0]  # the next window

    def gap(self, key: str, start_ns: int | None, end_ns: int | None, reason: str, caused: bool = False) -> str:
        """A stream gap (its reason returned). `caused`: found by a read after the stream could
        not be read; the reason then names the collector's fault that kept it from being read —
        this follower's last failure, else a collector event of the run or pod discovery open
        within the gap's window — and that event is told should a gap finding follow."""
        now = time.time_ns()
        if start_ns is None:  # nothing read from this stream: lost from its start
            start_ns = 0
        end_ns = end_ns if end_ns is not None else now
        if caused:
            why, event = self._cause_of(start_ns, end_ns)
            if why:
                reason += why
                self.detectors.caused(reason, event)
        self.sink.add_gap(StreamGap(key, start_ns, end_ns, reason, now))
        self.status.gaps += 1
        log.warning("%s: stream gap on %s: %s", self.run, key, reason)
        return reason

    def _cause_of(self, start_ns: int, end_ns: int) -> tuple[str, object]:
        """The collector's fault behind a gap found from start_ns to end_ns, as words for its
        reason, and its collector event (None if not known)."""
        book = self.detectors.collector_events
        if self.cause is not None:
            kind, reason = self.cause
            what = CAUSES.get(kind, f"could not read the log ({kind})")
            return f"; meanwhile the collector {what}: {reason}", book.latest(self.run) if book is not None else None
        event = book.overlapping(self.run, start_ns, end_ns) if book is not None else None
        if event is None:
            return "", None
        who = "pod discovery" if not event.run else f"the collector's {event.source}"
        return f"; meanwhile {who} was failing ({event.kind}): {event.reason}", event

