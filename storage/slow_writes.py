"""Writes to an object store that take long, said while they do. The store's client (pyarrow's
AWS and Google SDKs, under pyiceberg) retries a store that is away for seconds without telling
anyone, so an 8-12 s outage used to pass in silence. No client hook is needed to see it: a write
still running after SLOW_S is one warning line, and its end one line more (done: the store
answers again; failed: why), so every spell starts and ends in the log."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager

SLOW_S = 5.0  # a lake commit is well under a second to a few seconds on a healthy store


class SlowWrites:
    """One per writer (a Lake): `with watch(what):` around each write to the store."""

    def __init__(self, where: str, log: logging.Logger, slow_s: float = SLOW_S) -> None:
        self.where, self.log, self.slow_s = where, log, slow_s
        self.spells = 0  # writes that were said slow (for tests and summaries)

    @contextmanager
    def watch(self, what: str):
        start = time.monotonic()
        said = threading.Event()

        def slow() -> None:
            said.set()
            self.spells += 1
            self.log.warning("%s: %s still running after %.0f s: the object store is away or slow "
                             "(its client retries)", self.where, what, self.slow_s)

        timer = threading.Timer(self.slow_s, slow)
        timer.daemon = True
        timer.start()
        try:
            yield
        except BaseException as exc:
            timer.cancel()
            if said.is_set():
                self.log.warning("%s: %s failed after %.1f s: %s", self.where, what, time.monotonic() - start,
                                 str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__)
            raise
        timer.cancel()
        if said.is_set():
            self.log.warning("%s: %s done after %.1f s: the object store answers again", self.where, what,
                             time.monotonic() - start)
