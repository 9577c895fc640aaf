"""Whether the store answers, for /healthz: probed on a thread of its own, so health never
waits behind the lanes' work."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from steptail.storage.db import Store
from steptail.storage.status import reachable

PROBE_INTERVAL = 1.0  # seconds between store probes of /healthz
PROBE_STALE = 5.0  # a probe unanswered this long: the store is not answering
log = logging.getLogger("steptail.serve")  # the server's one logger, whichever module logs


class StoreProbe:
    """Whether the store answers, asked every `interval` s on a thread of its own, so that
    /healthz answers from the event loop at once, whatever the lanes are doing. A change is
    one log line; a probe that has not come back for `stale` s counts as an unanswering store."""

    def __init__(self, store: Store, interval: float = PROBE_INTERVAL, stale: float = PROBE_STALE) -> None:
        self.store, self.interval, self.stale = store, interval, stale
        self.ok: bool | None = None
        self.at = 0.0  # time.monotonic() of the last answer
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="steptail-serve-probe")

    def problem(self) -> str | None:
        """None when healthy, else what /healthz says of the store."""
        if time.monotonic() - self.at > self.stale:
            return "not answering"
        return None if self.ok else "unreachable"

    async def probe(self) -> None:
        ok = await asyncio.get_running_loop().run_in_executor(self._thread, self._reachable)
        if ok != self.ok and self.ok is not None:
            (log.info if ok else log.error)("store %s", "reachable again" if ok else "unreachable")
        self.ok, self.at = ok, time.monotonic()

    def _reachable(self) -> bool:
        try:
            return reachable(self.store)
        except Exception:  # noqa: BLE001 - whatever the driver raised, the store did not answer
            return False

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.probe()

    async def context(self, _app: web.Application):
        """aiohttp cleanup context: the first probe before the server listens, then in the background."""
        with contextlib.suppress(TimeoutError):  # a hung store: listen anyway, /healthz says so
            await asyncio.wait_for(self.probe(), self.stale)
        task = asyncio.create_task(self._loop())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self._thread.shutdown(wait=False, cancel_futures=True)
