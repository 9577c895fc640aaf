"""Whether one source works: pod discovery, a run's follower (kubectl, the API), a run's
store writes. A source is ok or failing with a kind (auth, forbidden, network, deserialize,
…) and a reason, the API's or kubectl's own words.

One log line when a failure starts or changes kind and one when it clears, never one per
retry; every failure is counted by kind (the run's status, for the summary) and reaches
Prometheus (errors by kind, the up gauges)."""

from __future__ import annotations

import logging
import time

from steptail.collector.kubectl import mask

log = logging.getLogger("steptail.health")


class Health:
    def __init__(self, source: str, run: str = "", metrics=None, status=None) -> None:
        self.source, self.run = source, run
        self.metrics = metrics  # steptail.collector.metrics.Metrics
        self.status = status  # the run's RunStatus: failures and errors by kind
        self.failing: tuple[str, str] | None = None  # (kind, reason)
        self.last: tuple[str, str] | None = None  # the latest failure, cleared or not
        self.since: float | None = None  # monotonic start of the current failing spell
        self.counts: dict[str, int] = {}
        self.worked = False  # has succeeded at least once
        self._failures_in_spell = 0
        if metrics is not None:
            metrics.up(run, source, source != "discovery")  # discovery is up once pods are listed

    @property
    def name(self) -> str:
        return f"{self.run}: {self.source}" if self.run else self.source

    def failing_for(self) -> float:
        return 0.0 if self.since is None else time.monotonic() - self.since

    def fail(self, kind: str, reason: str, exc_info=None) -> bool:
        """Count one failure; True (and one log line) when the source starts failing or the
        kind of its failure changes."""
        reason = mask(reason)[:500]
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self._failures_in_spell += 1
        if self.status is not None:
            self.status.failures += 1
            self.status.errors[kind] = self.status.errors.get(kind, 0) + 1
        if self.metrics is not None:
            self.metrics.error(self.run, self.source, kind)
        previous, self.failing = self.failing, (kind, reason)
        self.last = self.failing
        if previous is not None and previous[0] == kind:
            return False
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
        if self.metrics is not None:
            self.metrics.up(self.run, self.source, True)
        log.info("%s ok again after %.1f s (%s, %d failure%s)", self.name, took, kind, n, "" if n == 1 else "s",
                 extra=self._fields("ok", kind, reason))
        return True

    def state(self) -> str:
        return "ok" if self.failing is None else f"failing ({self.failing[0]})"

    def _fields(self, state: str, kind: str, reason: str) -> dict:
        return {"run": self.run, "source": self.source, "state": state, "kind": kind, "reason": reason}
