"""New reads of pods wait while a replica may have lost its runs without knowing it.

A replica stopped (SIGSTOP, a paused node) or starved long enough may find, once it runs
again, that another replica took its runs meanwhile (collector.live.ownership.HUNG_AFTER). The
streams it had open are closed at its next look at the fleet; a read it opens before that
look (a quiet stream's probe, a re-read) reads beside the new owner. So once the loop's clock
has jumped, every new read waits for the first look begun after the jump to be applied (runs
lost by then are stopped). A read already open is not touched: only the look may stop it.

With the store unreachable after a jump, reads wait for it: this replica cannot know whether
its runs are still its own (the ownership health says so meanwhile)."""

from __future__ import annotations

import asyncio
import logging
import math
import time

log = logging.getLogger("steptail.replicas")

JUMP = 1.0  # seconds the loop did not run: its runs may be another replica's by now
TICK = 0.2  # how often the loop's clock is read when nothing else reads it


class ReadGate:
    def __init__(self, jump: float = JUMP) -> None:
        self.jump = jump
        self.jumps = 0
        self._tick = time.monotonic()
        self.resumed_at = -math.inf  # when the latest jump was seen
        self._open = asyncio.Event()
        self._open.set()

    def _see(self) -> float:
        """The loop's clock now; a jump since the last reading closes the gate."""
        now = time.monotonic()
        if now - self._tick > self.jump:
            self.jumps += 1
            self.resumed_at = now
            if self._open.is_set():
                log.info("this replica did not run for %.1f s: new reads of pods wait for its next "
                         "look at the fleet", now - self._tick)
            self._open.clear()
        self._tick = now
        return now

    async def tick_forever(self) -> None:
        while True:
            self._see()
            await asyncio.sleep(TICK)

    def look_started(self) -> float:
        return self._see()

    def looked(self, started: float) -> None:
        """A look begun at `started` has been applied: if it began after the latest jump, the
        runs still held here are known to be ours, and reads go on."""
        self._see()
        if started >= self.resumed_at and not self._open.is_set():
            self._open.set()
            log.info("looked at the fleet after the pause: reads of the runs still owned go on")

    @property
    def closed(self) -> bool:
        self._see()
        return not self._open.is_set()

    async def wait(self) -> None:
        self._see()
        if not self._open.is_set():
            await self._open.wait()
