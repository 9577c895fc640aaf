"""Faults the API server injects: auth lapse (401), queued failures (500/503…), RBAC denial
of pod list/watch (403), undeserializable pods, slow and hanging answers, the end of every
open stream (clean or dropped), and watches expired by compaction (410 Gone).

The workload faults (rotation, restarts, stalls, rate) live in controller.py. This is plain
state: read and changed under ClusterState.lock. Every fault is also recorded in `history`
(ApiOutage) for the truth: when the API could not serve, or served late.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field


@dataclass
class ApiOutage:
    """One API fault as it happened: kind, true wall-clock ns it started and ended (None while
    in force; an instant fault such as eof_streams has from_ns == to_ns), and its parameters."""

    kind: str  # auth_lapse | deny | fail_next | throttle | corrupt_pods | slow_api | hang_api | eof_streams | watch_gone
    from_ns: int
    to_ns: int | None
    params: dict = field(default_factory=dict)


@dataclass
class _Timed:
    """A fault on requests whose path contains `path` (None: every request) until `until`."""

    until: float  # time.time()
    path: str | None
    delay: float = 0.0
    streams: bool = False  # hang_api: open streams freeze too
    retry_after: int | None = None  # throttle: the seconds its 429 names

    def applies(self, path: str, now: float) -> bool:
        return now < self.until and (self.path is None or self.path in path)


def _ns(t: float) -> int | None:
    return None if math.isinf(t) else int(t * 1e9)


@dataclass
class ApiFaults:
    lapse_until: float = 0.0  # time.time() before which every request gets 401
    # (code, path substring, Retry-After seconds or None, record)
    fail_queue: list[tuple[int, str | None, int | None, ApiOutage]] = field(default_factory=list)
    deny_until: float = 0.0  # pod list/watch answered 403 Forbidden until then (time.time())
    deny_user: str = ""
    corrupt_until: float = 0.0  # pods in list/watch undeserializable until then
    eof_gen: int = 0  # bumped by eof_streams: a stream opened under an older value ends
    abort_gen: int = 0  # bumped by eof_streams(abort=True): ... and its connection is dropped, no final chunk
    watch_drop_gen: int = 0  # bumped by watch_gone(drop): open watches' connections dropped
    gone_gen: int = 0  # bumped by watch_gone: open watches get an ERROR 410 Expired event and end
    compacted_rv: int = 0  # watch_gone: a watch from an older resourceVersion gets 410 Expired
    slow: list[_Timed] = field(default_factory=list)
    hang: list[_Timed] = field(default_factory=list)
    throttled: list[_Timed] = field(default_factory=list)
    history: list[ApiOutage] = field(default_factory=list)

    # ---- setting (cluster.py's fault methods)
    def record(self, kind: str, seconds: float | None = 0.0, **params) -> ApiOutage:
        now = time.time()
        until = math.inf if seconds is None else now + float(seconds)
        o = ApiOutage(kind, int(now * 1e9), _ns(until), {k: v for k, v in params.items() if v is not None})
        self.history.append(o)
        return o

    def queue_failures(self, n: int, code: int, path: str | None, retry_after: int | None = None) -> None:
        """`n` failures for the next matching requests. A burst that comes while one of the same
        kind is still unanswered at the queue's tail overlaps it rather than queueing behind it: an
        outage is a span of time, and two at once are one (stacked, two bursts of 5 made 10 in a
        row). Bursts of other kinds in between stay a sequence (503, 403, 503: nine answers)."""
        o = self.record("fail_next", None, n=n, code=code, path=path, retry_after=retry_after)
        pending = 0  # the same kind unanswered at the queue's tail (a sequence of kinds stays one)
        for c, p, ra, _ in reversed(self.fail_queue):
            if (c, p, ra) != (code, path, retry_after):
                break
            pending += 1
        self.fail_queue.extend([(code, path, retry_after, o)] * max(0, n - pending))
        if n <= pending:
            o.to_ns = time.time_ns()  # wholly inside the one still running

    def add_slow(self, seconds: float, delay: float, path: str | None) -> None:
        self.record("slow_api", seconds, delay=delay, path=path)
        self.slow.append(_Timed(time.time() + float(seconds), path, delay=float(delay)))

    def add_throttle(self, seconds: float, path: str | None, retry_after: int) -> None:
        self.record("throttle", seconds, path=path, retry_after=retry_after)
        self.throttled.append(_Timed(time.time() + float(seconds), path, retry_after=retry_after))

    def add_hang(self, seconds: float, path: str | None, streams: bool) -> None:
        self.record("hang_api", seconds, path=path, streams=streams)
        self.hang.append(_Timed(time.time() + float(seconds), path, streams=streams))

    # ---- checking (api.py, logs.py)
    def lapsed(self) -> bool:
        return time.time() < self.lapse_until

    def take_failure(self, path: str) -> tuple[int, int | None] | None:
        """(status code, Retry-After seconds or None) for this request: 429 while a throttle of
        its path lasts, else what is queued, if the head of the queue matches it."""
        now = time.time()
        self.throttled = [t for t in self.throttled if now < t.until]
        for t in self.throttled:
            if t.applies(path, now):
                return 429, t.retry_after
        if self.fail_queue:
            code, sub, retry_after, o = self.fail_queue[0]
            if sub is None or sub in path:
                self.fail_queue.pop(0)
                if not any(rec is o for *_, rec in self.fail_queue):
                    o.to_ns = time.time_ns()  # its last failure answered: the burst is over
                return code, retry_after
        return None

    def denied_user(self) -> str | None:
        return self.deny_user if time.time() < self.deny_until else None

    def corrupting(self) -> bool:
        return time.time() < self.corrupt_until

    def delay(self, path: str) -> float:
        """Seconds a request on `path` waits before it is handled (slow_api; the longest applies)."""
        now = time.time()
        self.slow = [s for s in self.slow if now < s.until]
        return max((s.delay for s in self.slow if s.applies(path, now)), default=0.0)

    def hanging(self, path: str, stream: bool = False) -> bool:
        """A request on `path` gets no answer now (hang_api); `stream`: an open stream's next
        bytes, held only by a hang with `streams`."""
        now = time.time()
        self.hang = [h for h in self.hang if now < h.until]
        return any(h.applies(path, now) and (h.streams or not stream) for h in self.hang)
