"""Listening: a TCP site that never runs out of descriptors (at the cap a new connection pushes
out the oldest idle one), header and body timeouts, and one log line a second when out of
descriptors instead of a traceback per refused accept."""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import time

from aiohttp import web

from steptail.http.app import make_app
from steptail.http.keys import ANSWERING
from steptail.http.lanes import EXPORT_LANE, READ_LANE
from steptail.http.probe import PROBE_INTERVAL
from steptail.storage.db import Store

HEADER_TIMEOUT = 10.0
BODY_TIMEOUT = 10.0
MAX_CONNECTIONS = 1024
FD_RESERVE = 64  # descriptors kept for the store, threads and logs
BACKLOG = 128  # asyncio accepts up to this many at once, before any is pushed out
log = logging.getLogger("steptail.serve")  # the server's one logger, whichever module logs


class GuardedSite(web.BaseSite):
    """A TCP site holding at most `max_connections`. At the cap, a new connection pushes out the
    oldest one that is not being answered (idle, or still sending its header): descriptors
    never run out, and a health probe always gets in."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, answering: set,
                 max_connections: int, backlog: int = 128) -> None:
        super().__init__(runner, backlog=backlog)
        self.host, self.port, self.answering, self.max_connections = host, port, answering, max_connections

    @property
    def name(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        self._server = await asyncio.get_running_loop().create_server(
            lambda: self._admit(server), self.host, self.port, backlog=self._backlog, reuse_address=True)

    def _admit(self, server: web.Server):
        open_now = [c for c in server.connections if c.transport is not None]
        if len(open_now) >= self.max_connections:
            idle = next((c for c in open_now if c not in self.answering), None)
            if idle is not None:
                idle.force_close()
        return server()


def _one_line_when_out_of_descriptors(previous):
    """A loop exception handler: out of descriptors, asyncio reports every refused accept with
    a traceback (megabytes a minute); one line a second says it instead."""
    last = [0.0]

    def handle(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
            if time.monotonic() - last[0] >= 1.0:
                last[0] = time.monotonic()
                log.error("out of file descriptors: new connections wait (%s)", exc.strerror)
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    return handle


def connection_limit(wanted: int = MAX_CONNECTIONS) -> int:
    """At most `wanted`, and far enough below the descriptor limit for a burst of accepts, the
    store and the logs: out of descriptors, asyncio logs a traceback per refused accept."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(8, min(wanted, soft - FD_RESERVE - BACKLOG))


async def serve(store: Store, host: str, port: int, token: str | None,
                started=None, stop: asyncio.Event | None = None, *, header_timeout: float = HEADER_TIMEOUT,
                body_timeout: float = BODY_TIMEOUT, max_connections: int | None = None,
                export_lane: tuple[int, int, int] = EXPORT_LANE, read_lane: tuple[int, int, int] = READ_LANE,
                probe_interval: float = PROBE_INTERVAL) -> None:
    """Run until `stop` is set (or the task is cancelled); `started(url)` once listening."""
    app = make_app(store, token, export_lane=export_lane, read_lane=read_lane, probe_interval=probe_interval)
    # keepalive_timeout runs from the connection's start and after each answer, and is not
    # reset by incoming bytes: it is the header timeout. lingering_time bounds reading a body.
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=header_timeout,
                           lingering_time=body_timeout)
    await runner.setup()
    loop = asyncio.get_running_loop()
    previous_handler = loop.get_exception_handler()
    loop.set_exception_handler(_one_line_when_out_of_descriptors(previous_handler))
    try:
        site = GuardedSite(runner, host, port, app[ANSWERING], max_connections or connection_limit(), BACKLOG)
        await site.start()
        bound = site._server.sockets[0].getsockname()  # the real port when port=0
        if started:
            h = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
            started(f"http://{h}:{bound[1]}")
        await (stop or asyncio.Event()).wait()
    finally:
        loop.set_exception_handler(previous_handler)
        await runner.cleanup()
