"""A TCP proxy in front of the database, so a test can take the database away (and give it
back) without touching the shared PostgreSQL server.

    proxy = DbProxy(target_port=5432)
    port = proxy.start()                  # 127.0.0.1, ephemeral port
    url = proxy.url("postgresql+psycopg://postgres@127.0.0.1:5432/db")   # same URL, the proxy's port
    proxy.cut("refuse")                   # live connections reset, new ones refused (ECONNREFUSED)
    proxy.cut("blackhole")                # live connections reset, new ones accepted and never answered
    proxy.cut("blackhole", existing="stall")  # a partition: live connections hang too
    proxy.restore()                       # new connections go through (and held or stalled ones resume)
    proxy.stop()

It runs its own event loop on a daemon thread: every method is a blocking, thread-safe call
(callers may themselves be inside another event loop, e.g. the simulator's driver, which
applies the `db_outage` fault). `outages` records each cut as (mode, from_ns, to_ns).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

MODES = ("refuse", "blackhole")
CHUNK = 65536
CALL_TIMEOUT = 10.0  # seconds a blocking call waits for the proxy's loop


@dataclass
class Outage:
    mode: str  # refuse | blackhole
    from_ns: int
    to_ns: int | None = None  # None while cut


@dataclass(eq=False)  # identity: kept in a set
class _Conn:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task] = field(default_factory=list)


def _reset(writer: asyncio.StreamWriter | None) -> None:
    """Close with a RST (SO_LINGER 0), as a crashed server or a failover does, not a clean FIN."""
    if writer is None:
        return
    sock = writer.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    writer.transport.abort()


class DbProxy:
    def __init__(self, target_host: str = "127.0.0.1", target_port: int = 5432, *,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.host = host
        self.port = port
        self.mode: str | None = None  # None: forwarding; else the cut in force
        self.stall_existing = False
        self.outages: list[Outage] = []
        self.accepted = 0  # connections accepted so far (forwarded, held or reset)
        self._conns: set[_Conn] = set()
        self._handlers: set[asyncio.Task] = set()  # one per accepted connection, ended by stop()
        self._open = asyncio.Event()  # set while forwarding; held and stalled traffic waits on it
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ---- blocking, thread-safe API
    def start(self) -> int:
        """Listen on host:port (0: ephemeral); returns the port."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="dbproxy", daemon=True)
        self._thread.start()
        self._call(self._start())
        return self.port

    def url(self, db_url: str) -> str:
        """`db_url` (SQLAlchemy or libpq URL) pointed at the proxy instead of the server."""
        parts = urlsplit(db_url)
        userinfo, _, _hostport = parts.netloc.rpartition("@")
        netloc = f"{userinfo}@{self.host}:{self.port}" if userinfo else f"{self.host}:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def cut(self, mode: str = "refuse", existing: str = "close") -> None:
        """The database goes away. Live connections are reset (`existing="close"`) or hang
        (`"stall"`: no byte passes until restore); new connections are refused (`refuse`: the
        port stops listening) or accepted and never answered (`blackhole`)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if existing not in ("close", "stall"):
            raise ValueError(f"existing must be 'close' or 'stall', got {existing!r}")
        self._call(self._cut(mode, existing == "stall"))

    def restore(self) -> None:
        """The database is back: listening again, held and stalled connections resume."""
        self._call(self._restore())

    def stop(self) -> None:
        """Reset every connection and stop listening (the real server is not touched)."""
        if self._loop is None:
            return
        try:
            self._call(self._stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(5)
            if self._thread is None or not self._thread.is_alive():
                self._loop.close()
            self._loop = self._thread = None

    @property
    def connections(self) -> int:
        """Connections open through the proxy now."""
        with self._lock:
            return len(self._conns)

    def __enter__(self) -> DbProxy:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _call(self, coro):
        if self._loop is None:
            raise RuntimeError("DbProxy not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(CALL_TIMEOUT)

    # ---- on the proxy's loop
    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _start(self) -> None:
        self._open.set()
        await self._listen()

    async def _cut(self, mode: str, stall: bool) -> None:
        if self.mode is None:
            self.outages.append(Outage(mode, time.time_ns()))
        elif self.mode != mode:  # a cut changing its kind: a new outage record
            self.outages[-1].to_ns = time.time_ns()
            self.outages.append(Outage(mode, time.time_ns()))
        self.mode, self.stall_existing = mode, stall
        self._open.clear()
        if mode == "refuse" and self._server is not None:
            self._server.close()  # the port stops listening: connect() gets ECONNREFUSED
            self._server = None
        if not stall:
            for c in list(self._conns):
                self._drop(c)

    async def _restore(self) -> None:
        if self.mode is None:
            return
        if self._server is None:
            for _ in range(50):  # the same port again; reuse_address covers lingering sockets
                try:
                    await self._listen()
                    break
                except OSError:
                    await asyncio.sleep(0.1)
            else:
                raise RuntimeError(f"DbProxy could not listen on {self.host}:{self.port} again")
        self.outages[-1].to_ns = time.time_ns()
        self.mode, self.stall_existing = None, False
        self._open.set()

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for c in list(self._conns):
            self._drop(c)
        for t in list(self._handlers):
            t.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self.mode is not None:
            self.outages[-1].to_ns = time.time_ns()

    def _drop(self, c: _Conn) -> None:
        for t in c.tasks:
            t.cancel()
        _reset(c.client)
        _reset(c.upstream)
        with self._lock:
            self._conns.discard(c)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        self._handlers.add(task)
        c = _Conn(writer)
        with self._lock:
            self._conns.add(c)
        try:
            # blackhole: the TCP handshake completed (the kernel did it) but nothing answers
            await self._open.wait()
            if c not in self._conns:  # reset while held
                return
            up_reader, c.upstream = await asyncio.open_connection(*self.target)
            c.tasks = [asyncio.create_task(self._pipe(reader, c.upstream)),
                       asyncio.create_task(self._pipe(up_reader, writer))]
            await asyncio.wait(c.tasks, return_when=asyncio.FIRST_COMPLETED)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            if c in self._conns:
                self._drop(c)
            self._handlers.discard(task)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(CHUNK):
                if not self._open.is_set():
                    await self._open.wait()  # stalled (partition): hold the bytes until restore
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.CancelledError):
            pass
