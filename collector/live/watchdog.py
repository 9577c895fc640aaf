"""When to suspect a quiet log stream of hanging, judged by the stream's own pace.

kubelet log rotation can leave `kubectl logs -f` open and silent for good. No fixed
silence threshold fits every stream: a short one re-opens a checkpoint save's quiet stream
every few seconds, a long one lets a chatty stream rotate again meanwhile and lose lines.
So the follower asks the pod (a cheap non-follow read of its last line) once the stream is
quieter than usual — max(FLOOR, K × the median quiet gap between its bursts of lines) —
and re-opens the stream only when the pod holds a line the stream has not delivered. While
the container stays quiet the checks back off, doubling up to `cap` (`--silence`); a look
the API refused is tried again within a second or two, never left until `cap`."""

from __future__ import annotations

import statistics
from collections import deque

from steptail.collector.notify.health import Backoff

FLOOR = 2.0  # seconds: below this, scheduling noise alone would trigger checks
K = 1.5  # "quieter than usual": 1.5 x the usual interval between bursts
BURST_NS = 100_000_000  # lines closer than this belong to one burst (one step's lines)
HISTORY = 32  # intervals kept for the median
UNKNOWN_RETRY = 0.5  # seconds: a look at the pod that failed is tried again this soon


class Pace:
    """The writer's pace from kubelet timestamps: the quiet gaps between bursts of lines,
    from a burst's last line to the next one's first — what the watchdog waits out. Not from
    a burst's start: a stream that writes steadily is one endless burst, and its first short
    pause (a checkpoint save) would read as an interval as long as the whole stream so far
    (issue 33: a 30 s threshold after a 1 s pause, and a second rotation took the lines)."""

    def __init__(self) -> None:
        self._last_ns: int | None = None
        self.intervals: deque[int] = deque(maxlen=HISTORY)

    def see(self, ts_ns: int | None) -> None:
        if ts_ns is None:
            return
        last = self._last_ns
        if last is not None and ts_ns <= last + BURST_NS:
            self._last_ns = max(last, ts_ns)  # same burst (or a reconnect's overlap)
            return
        if last is not None:
            self.intervals.append(ts_ns - last)
        self._last_ns = ts_ns

    def usual_s(self) -> float | None:
        """Median seconds of quiet between bursts; None before two bursts were seen."""
        return statistics.median(self.intervals) / 1e9 if self.intervals else None


class Watchdog:
    """Seconds of quiet (since the last line) at which to check the pod next."""

    def __init__(self, pace: Pace, cap: float) -> None:
        self.pace, self.cap = pace, cap
        self._refused = Backoff(start=UNKNOWN_RETRY)  # looks the API refused: the shared rule
        self.reset()

    @property
    def refused(self) -> bool:
        """The latest look at the pod failed, with no wait named (the follower asks again at once
        on a recovery; a look throttled with Retry-After waits what the server asked)."""
        return self._refused.kind is not None and self._refused.retry_after is None

    def threshold(self) -> float:
        usual = self.pace.usual_s()
        wait = FLOOR if usual is None else max(FLOOR, K * usual)
        return min(wait, self.cap)

    def reset(self) -> None:
        """A line arrived: the next check comes after one threshold of quiet."""
        self._interval = self.threshold()
        self._refused.ok()
        self.next_check = self._interval

    def unknown(self, quiet: float, retry_after: float | None = None) -> None:
        """The pod could not be asked (the API failed): ask again after UNKNOWN_RETRY, doubling
        while it keeps failing, at most one threshold later; or exactly when the answer said
        (`retry_after`: a 429's Retry-After), no back-off of ours on top. A hung stream is not
        left until `cap` because the API refused one look."""
        self._refused.fail("look", retry_after)
        self.next_check = quiet + self._refused.delay(self.threshold())

    def quiet_confirmed(self, quiet: float) -> None:
        """The pod holds nothing new: check again later, twice as late each time."""
        self._interval = min(self._interval * 2, self.cap)
        self._refused.ok()
        self.next_check = quiet + self._interval
