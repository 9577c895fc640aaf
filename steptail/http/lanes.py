"""Lanes: bounded executors for store work, each with a queue limit beyond which a request is a
503 with `Retry-After` instead of queueing without bound (eight exports of a big run once held
the default pool, and /healthz with it, for 15 s); a kept store connection per lane thread."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from steptail.http.answers import ApiError
from steptail.storage.db import DatabaseFailure, Store

# (threads, requests waiting beyond them, Retry-After seconds of a 503)
EXPORT_LANE = (2, 4, 10)  # a whole-run bundle: seconds of CPU and a temporary folder each
READ_LANE = (4, 64, 1)  # pages, findings, the run list, metrics: bounded queries
log = logging.getLogger("steptail.serve")  # the server's one logger, whichever module logs


class Lane:
    """`workers` threads for one kind of store work and at most `queue` requests waiting for
    them; beyond that a request is refused at once (503, `Retry-After`) instead of queueing
    without bound. A job counts until its thread is done with it, even when its client left
    (a thread cannot be stopped), so hanging up does not make room."""

    def __init__(self, name: str, workers: int, queue: int, retry_after: int) -> None:
        self.name, self.limit, self.retry_after = name, workers + queue, retry_after
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix=f"steptail-serve-{name}")
        self._lock = threading.Lock()
        self.pending = 0  # running or waiting
        self.refused = 0  # 503s since start (steptail_serve_refused_total)
        self._refusing = 0  # 503s since the lane last took a job: one line when it starts, one when it clears

    async def run(self, fn, *args):
        return await asyncio.wrap_future(self.submit(fn, *args))  # cancelled while waiting: dropped too

    def submit(self, fn, *args) -> Future:
        """The job's future, or ApiError 503 when the lane is full."""
        with self._lock:
            if self.pending >= self.limit:
                self.refused += 1
                self._refusing += 1
                if self._refusing == 1:
                    log.warning("%s lane full (%d running or waiting): answering 503 until a place frees",
                                self.name, self.pending)
                err = ApiError(503, f"busy: {self.pending} {self.name} requests running or waiting "
                                    f"(at most {self.limit}); retry in {self.retry_after} s")
                err.headers["Retry-After"] = str(self.retry_after)
                raise err
            self.pending += 1
            if self._refusing:
                log.info("%s lane taking requests again (%d refused)", self.name, self._refusing)
                self._refusing = 0
        try:
            job = self.executor.submit(functools.partial(fn, *args))
        except BaseException:
            self._done(None)
            raise
        job.add_done_callback(self._done)
        return job

    def _done(self, _job) -> None:
        with self._lock:
            self.pending -= 1

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


class LaneConnections:
    """A store connection per lane thread, kept from one request to the next in autocommit:
    one out of the pool cost a ping and a rollback, two round trips more than a 304's one
    query. A connection the driver found broken is replaced, and the job tried once more."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set = set()

    def call(self, fn, *args):
        """fn(connection, *args) on this thread's connection."""
        try:
            return fn(self._connection(), *args)
        except DatabaseFailure as exc:
            if not exc.connection_invalidated:
                raise
            self._drop()
        return fn(self._connection(), *args)

    def _connection(self):
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self.store.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            with self._lock:
                self._open.add(conn)
        return conn

    def _drop(self) -> None:
        conn, self._local.conn = self._local.conn, None
        with self._lock:
            self._open.discard(conn)
        with contextlib.suppress(Exception):  # already broken: closing it is all that is left
            conn.close()

    def close(self) -> None:
        with self._lock:
            conns, self._open = list(self._open), set()
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.close()


class LaneCollector:
    """The lanes' load at scrape time: what is running or waiting, and the 503s answered."""

    def __init__(self, *lanes: Lane) -> None:
        self.lanes = lanes

    def collect(self):
        pending = GaugeMetricFamily("steptail_serve_lane_pending", "Requests running or waiting in a lane",
                                    labels=["lane"])
        refused = CounterMetricFamily("steptail_serve_refused", "Requests answered 503: their lane was full",
                                      labels=["lane"])
        for lane in self.lanes:
            pending.add_metric([lane.name], lane.pending)
            refused.add_metric([lane.name], lane.refused)
        yield from (pending, refused)
