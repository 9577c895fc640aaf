"""Whether one source works: pod discovery, a run's follower (kubectl, the API), a run's
store writes. A source is ok or failing with a kind (auth, forbidden, network, deserialize,
…) and a reason, the API's or kubectl's own words.

One log line when a failure starts or changes kind and one when it clears, never one per
retry; every failure is counted by kind (the run's status, for the summary, with its last
error) and reaches Prometheus (errors by kind, the up gauges). A failure is told here once,
where it happens: whatever else must know (the run's detectors, the follower's cause of the
next gap) subscribes to the source (`Health.subscribe`), never told beside it."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

_SECRET = re.compile(r"(Bearer|token[\"':= ]+)\s*[A-Za-z0-9._~+/=-]{8,}", re.I)


def mask(text: str) -> str:
    """Bearer tokens and token values replaced by ***: nothing logged carries a credential."""
    return _SECRET.sub(r"\1 ***", text)


BACKOFF_START = 0.25  # seconds before the first retry of a failure
RETRY_AFTER_MAX = 60.0  # seconds: the longest Retry-After honoured as it is

log = logging.getLogger("steptail.health")

REPEAT_WINDOW = 10.0  # seconds: the same line again within this is counted, not logged


class Repeats(logging.Filter):
    """Collapses repeats of one log line: the same message from the same logger, again within
    REPEAT_WINDOW of its last logging, is counted instead of logged. The count is logged as a
    line of its own ("… (repeated N more times)") before the next line that differs, or on
    the same line once the window has passed. A loop that fails fast stays readable and still
    says how often it happened."""

    def __init__(self, window: float = REPEAT_WINDOW) -> None:
        super().__init__()
        self.window = window
        self._last: logging.LogRecord | None = None  # the line logged last
        self._key: tuple | None = None  # its (logger, level, message)
        self._repeats = 0  # its repeats not logged

    def reset(self) -> None:
        """Forget the last line and its repeats not logged (a test starting from a clean log)."""
        self._last, self._key, self._repeats = None, None, 0

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, record.getMessage())
        last = self._last
        if last is not None and key == self._key:
            if record.created - last.created < self.window:
                self._repeats += 1
                return False
            if self._repeats:
                record.msg, record.args = f"{key[2]} (repeated {self._repeats} more times before)", None
        elif last is not None and self._repeats:
            summary = logging.makeLogRecord(last.__dict__)
            summary.msg, summary.args = f"{self._key[2]} (repeated {self._repeats} more times)", None
            summary.created = record.created
            logging.getLogger(last.name).callHandlers(summary)  # not filtered again: said once
        self._last, self._key, self._repeats = record, key, 0
        return True


def collapse_repeats(*names: str) -> None:
    """One Repeats filter on each of these loggers (a logger's filter sees what is logged on it)."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, Repeats) for f in logger.filters):
            logger.addFilter(Repeats())


collapse_repeats("steptail.follow", "steptail.health")


class Backoff:
    """The retry rule of every source: the wait doubles with each failure of the same kind in
    a row, starts from `start` (BACKOFF_START) again when the kind changes or after a success
    (an auth lapse's waits never lengthen the retries of a later 503), and is at most `cap`.
    A failure whose answer named its own wait (a 429's or 503's `Retry-After`) waits exactly
    that: the server said when to come back, and our doubling on top made nine queued 429s
    cost 15 s (chaos seed 1001). A wait is ended early by a Recovery (below): a source that
    works again ends them all."""

    def __init__(self, start: float = BACKOFF_START) -> None:
        self.start = start
        self.kind: str | None = None  # of the current spell; None after a success
        self.same_kind = 0  # failures in a row of that kind (the exponent)
        self.retry_after: float | None = None  # the wait the latest failure's answer named

    def fail(self, kind: str, retry_after: float | None = None) -> None:
        self.same_kind = self.same_kind + 1 if kind == self.kind else 1
        # bounded: a server's word of an hour would leave a running pod's log to rotate away
        self.kind = kind
        self.retry_after = None if retry_after is None else max(0.0, min(float(retry_after), RETRY_AFTER_MAX))

    def ok(self) -> None:
        self.kind, self.same_kind, self.retry_after = None, 0, None

    def delay(self, cap: float) -> float:
        if self.kind is None:
            return 0.0
        if self.retry_after is not None:
            return self.retry_after  # the server's word, not capped below it nor doubled
        return min(cap, self.start * 2 ** min(self.same_kind - 1, 30))


class Recovery:
    """The health shared by everything that talks to the cluster (pod discovery, the JobSet
    and Workload watches, every run's follower): when a source that was failing works again,
    the cluster answers again, so every back-off still running ends now and each failing
    source retries at once. Per-source back-offs alone kept a follower waiting 4.6 s after
    an auth lapse had cleared for pod discovery, and a rotation took the lines (issue 33).

    `generation` counts recoveries: a wait started under one generation ends when it moves.
    Told on the event loop (Health.ok); waited for on the loop (`listeners` are woken: pod
    discovery's change event) or on a watch thread (`wait_blocking`)."""

    SLICE = 0.05  # seconds: how often a waiting thread looks at the generation

    def __init__(self) -> None:
        self.generation = 0
        self.failing: set[int] = set()  # id() of each Health failing now
        self.listeners: list[Callable[[], None]] = []  # called at each recovery (on the loop)
        # a failure came since the last wake: the next request answered anywhere wakes its source
        # (once per failure, so a source failing alone is not retried at every other success)
        self._unanswered = False
        self._woken_at = -BACKOFF_START  # monotonic time of the latest wake by an answer

    def fail(self, source: object) -> None:
        self.failing.add(id(source))
        self._unanswered = True

    def cleared(self, source: object) -> None:
        """`source` works again after failing: every wait still running ends."""
        self.failing.discard(id(source))
        self._wake()

    def answered(self) -> None:
        """A request to the cluster succeeded (a look at a pod, a pod read, a stream's first
        line): the cluster answers, so every source waiting out a failure since the last wake
        retries now, not after its back-off. Cheap when nothing fails (every look calls it)."""
        # At most one such wake per BACKOFF_START: two followers failing each on its own pod's
        # log, each waking the other with its pod reads, would otherwise retry at every round trip.
        now = time.monotonic()
        if self.failing and self._unanswered and now - self._woken_at >= BACKOFF_START:
            self._woken_at = now
            self._wake()

    def _wake(self) -> None:
        self._unanswered = False
        self.generation += 1
        for wake in list(self.listeners):
            wake()

    def wait_blocking(self, delay: float, stopping: threading.Event) -> None:
        """On a thread: wait `delay` seconds, less if `stopping` is set or a recovery comes."""
        generation = self.generation
        deadline = time.monotonic() + delay
        while (left := deadline - time.monotonic()) > 0 and self.generation == generation:
            if stopping.wait(min(left, self.SLICE)):
                return


class Health:
    def __init__(self, source: str, run: str = "", metrics=None, status=None,
                 recovery: Recovery | None = None) -> None:
        self.source, self.run = source, run
        self.recovery = recovery  # shared with every source talking to the cluster (None: alone)
        self.metrics = metrics  # steptail.collector.notify.metrics.Metrics
        self.status = status  # the run's RunStatus: failures and errors by kind
        self.failing: tuple[str, str] | None = None  # (kind, reason)
        self.last: tuple[str, str] | None = None  # the latest failure, cleared or not
        self.since: float | None = None  # monotonic start of the current failing spell
        self.counts: dict[str, int] = {}
        self.worked = False  # has succeeded at least once
        self._failures_in_spell = 0
        self._backoff = Backoff()
        # the collector's events (collector.notify.collector_events.CollectorEvents): told when a
        # failure starts, changes kind, repeats and clears; set by whoever wires the source
        self.events = None
        # name -> (callable(kind, reason), at every failure or only when a spell starts/changes kind)
        self.listeners: dict[str, tuple[Callable[[str, str], None], bool]] = {}
        if metrics is not None:
            metrics.up(run, source, source != "discovery")  # discovery is up once pods are listed

    def subscribe(self, name: str, listener: Callable[[str, str], None], each: bool = True) -> None:
        """`listener(kind, reason)` told of this source's failures: every one (`each`), or only
        when a spell starts or its kind changes. One per name (a run's follower built again
        replaces its own)."""
        self.listeners[name] = (listener, each)

    @property
    def name(self) -> str:
        return f"{self.run}: {self.source}" if self.run else self.source

    def failing_for(self) -> float:
        return 0.0 if self.since is None else time.monotonic() - self.since

    def fail(self, kind: str, reason: str, exc_info=None, retry_after: float | None = None) -> bool:
        """Count one failure; True (and one log line) when the source starts failing or the
        kind of its failure changes. `retry_after`: the wait the answer named (Retry-After),
        the next back-off."""
        reason = mask(reason)[:500]
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self._failures_in_spell += 1
        if self.status is not None:
            self.status.failures += 1
            self.status.errors[kind] = self.status.errors.get(kind, 0) + 1
            self.status.last_error = f"{kind}: {reason}"
        if self.metrics is not None:
            self.metrics.error(self.run, self.source, kind)
        previous, self.failing = self.failing, (kind, reason)
        self.last = self.failing
        self._backoff.fail(kind, retry_after)
        if self.recovery is not None:
            self.recovery.fail(self)
        started = previous is None or previous[0] != kind
        for listener, each in list(self.listeners.values()):
            if each or started:
                listener(kind, reason)
        if not started:
            self._tell("failed_again", self.run, self.source)
            return False
        self._tell("changed", self.run, self.source, kind, reason)
        if previous is None:
            self.since = time.monotonic()
            if self.metrics is not None:
                self.metrics.up(self.run, self.source, False)
        log.warning("%s failing (%s): %s", self.name, kind, reason, exc_info=exc_info,
                    extra=self._fields("failing", kind, reason))
        return True

    def ok(self) -> bool:
        """The source works; True (and one log line) when that ends a failure."""
        first = not self.worked
        self.worked = True
        if self.failing is None:
            if first and self.metrics is not None:
                self.metrics.up(self.run, self.source, True)
            return False
        (kind, reason), self.failing = self.failing, None
        took, n = self.failing_for(), self._failures_in_spell
        self.since, self._failures_in_spell = None, 0
        self._backoff.ok()
        if self.recovery is not None:  # the cluster answers again: every other back-off ends too
            self.recovery.cleared(self)
        self._tell("changed", self.run, self.source, None, None)
        if self.metrics is not None:
            self.metrics.up(self.run, self.source, True)
        log.info("%s ok again after %.1f s (%s, %d failure%s)", self.name, took, kind, n, "" if n == 1 else "s",
                 extra=self._fields("ok", kind, reason))
        return True

    def _tell(self, what: str, *args) -> None:
        """The events' book told; a failure there is logged, never raised into the source."""
        if self.events is None:
            return
        try:
            getattr(self.events, what)(*args)
        except Exception as exc:  # noqa: BLE001
            log.warning("%s: collector event not recorded: %s", self.name, exc)

    def backoff(self, cap: float) -> float:
        """Seconds to wait before retrying the current failure (the Backoff rule)."""
        return 0.0 if self.failing is None else self._backoff.delay(cap)

    @property
    def told_to_wait(self) -> bool:
        """The current failure's answer named its wait (Retry-After): a recovery elsewhere does
        not cut it short — the server asked this request to wait, whoever else it answers."""
        return self.failing is not None and self._backoff.retry_after is not None

    def state(self) -> str:
        return "ok" if self.failing is None else f"failing ({self.failing[0]})"

    def _fields(self, state: str, kind: str, reason: str) -> dict:
        return {"run": self.run, "source": self.source, "state": state, "kind": kind, "reason": reason}
