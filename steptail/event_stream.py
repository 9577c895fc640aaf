"""`follow -o ndjson`: the events written by a thread of their own. A reader that stops reading
(a paused `jq`, a consumer that is busy) fills the pipe, and a write to a full pipe blocks:
written on the event loop, it would stop every read and commit, and the steps a log rotation
takes meanwhile would be lost. Instead the events wait in a bounded queue; past its bound they
are dropped, counted, said in the log when dropping starts and ends, and marked in the stream
itself (`{"event": "dropped", …}`) where they are missing. The store keeps every row."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

log = logging.getLogger("steptail.follow")
LIMIT = 10_000  # events held for a slow reader (about 10 MB of step and rbf events)
_END = object()


class EventStream:
    def __init__(self, write: Callable[[dict], None], closed: Callable[[], bool],
                 on_closed: Callable[[], None], limit: int = LIMIT) -> None:
        self._write, self._closed, self._on_closed = write, closed, on_closed
        self.limit = limit
        self._queue: deque = deque()
        self._cond = threading.Condition()
        self._dropping = 0  # dropped since the last event that fit
        self.dropped = 0  # in all
        self._thread = threading.Thread(target=self._run, name="ndjson-events", daemon=True)
        self._thread.start()

    def put(self, event: dict) -> None:
        """From the event loop: never blocks."""
        with self._cond:
            if len(self._queue) >= self.limit:
                if not self._dropping:
                    log.warning("events: stdout is not read fast enough (%d events waiting): dropping "
                                "events until it is; the store keeps every row", len(self._queue))
                self._dropping += 1
                self.dropped += 1
                return
            if self._dropping:  # where they are missing, in the stream itself
                self._queue.append({"event": "dropped", "events": self._dropping,
                                    "reason": "stdout was not read fast enough; the store holds every row"})
                log.warning("events: the reader caught up; %d events were dropped", self._dropping)
                self._dropping = 0
            self._queue.append(event)
            self._cond.notify()

    def close(self) -> None:
        """Every event queued written (waits for the reader, as any write to a pipe does)."""
        with self._cond:
            self._queue.append(_END)
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                event = self._queue.popleft()
            if event is _END:
                return
            if self._closed():
                continue  # the reader went away: the rest goes nowhere
            self._write(event)
            if self._closed():
                self._on_closed()
