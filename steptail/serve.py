"""`steptail serve`: read-only HTTP over the store (health, Prometheus metrics, JSON API, and
at `/` a live web page over that API: steptail/web, docs/page.md).

Health never waits behind work: /livez and /healthz answer from the event loop, /healthz with
the last result of a store probe that runs on a thread of its own. Store reads run in two
bounded lanes (Lane): exports in one, every other read in the other, each with a queue limit
beyond which a request is a 503 with a JSON body and `Retry-After` (eight exports of a big run
once held the default pool, and /healthz with it, for 15 s).
When a token is configured, everything but /healthz, /livez and the page's static files (`/`,
/static/…: nothing from the store) needs `Authorization: Bearer <token>`.
Every bad parameter is a 400 with a JSON body, every failure a JSON answer (no traceback); a
request path is logged escaped (a `%0a` in it cannot forge a log line).

Slow or idle clients cannot hold the server: a connection must send its request header within
`header_timeout` (also the keep-alive), a request body is read for at most `body_timeout`,
and at most `max_connections` are open (below the descriptor limit): at the cap a new
connection pushes out the oldest one that is not being answered."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import hashlib
import hmac
import json
import logging
import re
import resource
import shutil
import tempfile
import threading
import time
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote_to_bytes, urlencode

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from steptail.body_cache import BodyCache
from steptail.jsonsafe import strict
from steptail.runs.names import escaped  # one escaper for every name the CLI prints
from steptail.storage.api_reads import KEYS as STEP_FIELDS
from steptail.storage.api_reads import run_state, step_rows, steps_json
from steptail.storage.db import DatabaseFailure, Store
from steptail.storage.page_reads import LIVE_NS, outline, overview
from steptail.storage.reads import list_runs, run_exists, run_exists_on
from steptail.storage.status import reachable, run_gauges
from steptail.web import PAGE_HEADERS, MissingLibrary, asset

PAGE_DEFAULT = 1000
PAGE_MAX = 10_000
INT32_MAX = 2**31 - 1  # steps and incarnations are 32-bit in the store
HEADER_TIMEOUT = 10.0
BODY_TIMEOUT = 10.0
WRITE_TIMEOUT = 60.0  # one chunk of an export to a client that stopped reading
MAX_CONNECTIONS = 1024
RECENT_DAYS = 7.0  # /metrics: per-run series for runs updated this recently
MAX_RUN_SERIES = 1000  # … and at most this many of them (the most recently updated)
FD_RESERVE = 64  # descriptors kept for the store, threads and logs
BACKLOG = 128  # asyncio accepts up to this many at once, before any is pushed out
STORE = web.AppKey("store", Store)
TOKEN = web.AppKey("token", object)
REGISTRY = web.AppKey("registry", CollectorRegistry)
PROBE = web.AppKey("probe", object)  # StoreProbe
EXPORTS = web.AppKey("exports", object)  # Lane
READS = web.AppKey("reads", object)  # Lane
CONNECTIONS = web.AppKey("connections", object)  # LaneConnections of the read lane
BODIES = web.AppKey("bodies", BodyCache)  # answers of a run's routes, by ETag
# No token needed: the probes, and the page's static files (they hold nothing from the store;
# the page asks for the token and sends it with its API calls). Matched by route, not by path.
OPEN_ROUTES = ("/healthz", "/livez", "/", "/static/{name}")
ANSWERING = web.AppKey("answering", set)  # connections whose request is being handled
# Lanes: (threads, requests waiting beyond them, Retry-After seconds of a 503)
EXPORT_LANE = (2, 4, 10)  # a whole-run bundle: seconds of CPU and a temporary folder each
READ_LANE = (4, 64, 1)  # pages, findings, the run list, metrics: bounded queries
PROBE_INTERVAL = 1.0  # seconds between store probes of /healthz
PROBE_STALE = 5.0  # a probe unanswered this long: the store is not answering
RUN_MAX = 128  # runs.run is VARCHAR(128): no longer name is a run
log = logging.getLogger("steptail.serve")
_INTEGER = re.compile(r"-?[0-9]{1,19}\Z")  # ASCII digits only: int() also takes '²', '1_0', ' 1'


# -- JSON ------------------------------------------------------------------------------
def _dumps(data) -> str:
    try:  # fast path: stored values are finite almost always
        return json.dumps(data, allow_nan=False, separators=(",", ":"))
    except ValueError:
        return json.dumps(strict(data), allow_nan=False, separators=(",", ":"))


def _json(data, status: int = 200) -> web.Response:
    return web.Response(text=_dumps(data), status=status, content_type="application/json")


# -- ETags: a run's routes answer 304 to a client holding the current answer ---------------
# Bumped when a body's format changes: a tag a client kept from before must not match.
BODY_FORMAT = 1


def _etag(*parts) -> str:
    key = repr((BODY_FORMAT, *parts)).encode()
    return '"' + hashlib.blake2b(key, digest_size=12).hexdigest() + '"'


def _matches(if_none_match: str | None, tag: str) -> bool:
    """If-None-Match's weak comparison (RFC 9110 13.1.2): any listed tag, `W/` or not, or `*`."""
    if not if_none_match:
        return False
    given = {t.strip().removeprefix("W/") for t in if_none_match.split(",")}
    return tag in given or "*" in given


def _tagged(tag: str, body: bytes | None) -> web.Response:
    """200 with `body` (JSON), or 304 without a body when `body` is None; clients revalidate
    every time (no-cache), which a 304 makes cheap."""
    headers = {"ETag": tag, "Cache-Control": "no-cache"}
    if body is None:
        return web.Response(status=304, headers=headers)
    return web.Response(body=body, headers=headers, content_type="application/json", charset="utf-8")


def _hashed(data, if_none_match: str | None) -> tuple[str, bytes | None]:
    """(ETag, body) of an answer tagged by its own content; body None when the client has it."""
    body = _dumps(data).encode()
    tag = _etag(body)
    return tag, None if _matches(if_none_match, tag) else body


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message, "status": status}, status)


class ApiError(Exception):
    """An error answered as JSON (the message is not put in the HTTP status line)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers: dict[str, str] = {}


# -- lanes: bounded executors with a queue limit -------------------------------------------------
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


class BodyCacheCollector:
    """How often a run's answer came from the body cache, and what it holds."""

    def __init__(self, cache: BodyCache) -> None:
        self.cache = cache

    def collect(self):
        answers = CounterMetricFamily("steptail_serve_cached_answers", "Run answers (steps pages, outlines) "
                                      "made, or taken from the cache of unchanged runs", labels=["cache"])
        answers.add_metric(["hit"], self.cache.hits)
        answers.add_metric(["miss"], self.cache.misses)
        held = GaugeMetricFamily("steptail_serve_cache_bytes", "Bytes of answers held for unchanged runs")
        held.add_metric([], self.cache.size)
        yield from (answers, held)


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


# -- middleware: auth and JSON errors ---------------------------------------------------
@web.middleware
async def _guard(request: web.Request, handler):
    answering = request.app[ANSWERING]
    answering.add(request.protocol)
    try:
        return await _answer(request, handler)
    finally:
        answering.discard(request.protocol)


async def _answer(request: web.Request, handler):
    token = request.app[TOKEN]
    if token is not None and not _open(request):
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            resp = _error(401, "bearer token required")
            resp.headers["WWW-Authenticate"] = 'Bearer realm="steptail"'
            return resp
    try:
        _check_path(request)
        return await handler(request)
    except ApiError as exc:
        resp = _error(exc.status, exc.message)
        resp.headers.update(exc.headers)
        return resp
    except web.HTTPException as exc:
        if exc.status >= 400:
            return _error(exc.status, exc.reason)
        raise
    except (asyncio.CancelledError, ConnectionError):
        raise  # the client went away: nothing to answer
    except Exception as exc:  # noqa: BLE001 - one line in the log, JSON to the client
        text = str(exc).strip()
        log.error("%s %s failed: %s: %s", request.method, escaped(request.raw_path), type(exc).__name__,
                  escaped(text.splitlines()[0][:200]) if text else "''")
        return _error(500, "internal error")


def _open(request: web.Request) -> bool:
    """Whether the request's route needs no token (by the route it matched: a path such as
    `/static/../api/runs` matches no open route)."""
    resource = request.match_info.route.resource
    return resource is not None and resource.canonical in OPEN_ROUTES


def _refuse(request: web.Request, status: int, message: str, why: str) -> ApiError:
    """A request refused for what its path holds: one log line (path escaped), the JSON error."""
    log.warning("%s %s refused (%d): %s", request.method, escaped(request.raw_path), status, why)
    return ApiError(status, message)


def _check_path(request: web.Request) -> None:
    """A percent-escape that is not UTF-8 (`%FF`, `%C0%AF`) is a 400: no route or run has it."""
    try:
        unquote_to_bytes(request.raw_path.partition("?")[0]).decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse(request, 400, "the request path is not UTF-8", "percent-escapes not UTF-8") from None


def _impossible_run(run: str) -> str | None:
    """Why no run can have this name (without asking the store), else None. PostgreSQL cannot
    even compare a NUL (once a 500), and a control character is no name the CLI or a JobSet
    gives; runs.run holds RUN_MAX characters."""
    if any(c < " " or "\x7f" <= c <= "\x9f" for c in run):
        return "run name holds control characters"
    if len(run) > RUN_MAX:
        return f"run name of {len(run)} characters (at most {RUN_MAX})"
    return None


# -- metrics -----------------------------------------------------------------------------
class StoreCollector:
    """Store-derived gauges, read at scrape time; the same names as `follow`'s for the same facts
    (steptail_last_step, steptail_last_step_timestamp_seconds). Bounded: per-run series only
    for the `max_runs` runs most recently updated within `recent_days` (steptail_runs counts
    them all), so a store of years of runs stays a few series per live run."""

    def __init__(self, store: Store, recent_days: float = RECENT_DAYS, max_runs: int = MAX_RUN_SERIES) -> None:
        from steptail.storage.goodput import GoodputCache

        self.store, self.recent_days, self.max_runs = store, recent_days, max_runs
        self.goodput = GoodputCache(store)

    def collect(self):
        runs = GaugeMetricFamily("steptail_runs", "Runs in the store")
        recent = GaugeMetricFamily("steptail_recent_runs", f"Runs with per-run series: updated in the last "
                                   f"{self.recent_days:g} days, at most {self.max_runs}")
        last_step = GaugeMetricFamily("steptail_last_step", "Last recorded step of the run's latest incarnation",
                                      labels=["run"])
        last_ts = GaugeMetricFamily("steptail_last_step_timestamp_seconds",
                                    "Unix time of the run's latest recorded step (kubelet timestamp)", labels=["run"])
        steps = GaugeMetricFamily("steptail_stored_steps", "LOSS-PARTS rows in the store", labels=["run"])
        findings = GaugeMetricFamily("steptail_stored_findings", "Findings in the store", labels=["run"])
        goodput = GaugeMetricFamily("steptail_run_goodput", "Productive step time / wall time (docs/goodput.md)",
                                    labels=["run"])
        step_s = GaugeMetricFamily("steptail_run_median_step_seconds",
                                   "Median step time of the run's latest incarnation", labels=["run"])
        since_ns = time.time_ns() - int(self.recent_days * 86400e9)
        total, rows = run_gauges(self.store, since_ns, self.max_runs)
        runs.add_metric([], total)
        recent.add_metric([], len(rows))
        for run, last, ts_ns, n_steps, n_findings in rows:
            if last is not None:
                last_step.add_metric([run], last)
            if ts_ns is not None:
                last_ts.add_metric([run], ts_ns / 1e9)
            steps.add_metric([run], n_steps or 0)
            findings.add_metric([run], n_findings or 0)
            if n_steps:
                report = self.goodput.get(run, (n_steps, ts_ns, last))
                if report["goodput"] is not None:
                    goodput.add_metric([run], report["goodput"])
                latest = report["incarnations"][-1]["median_step_s"] if report["incarnations"] else None
                if latest is not None:
                    step_s.add_metric([run], latest)
        self.goodput.keep({row[0] for row in rows})
        yield from (runs, recent, last_step, last_ts, steps, findings, goodput, step_s)


# -- handlers ------------------------------------------------------------------------------
# Health and liveness: on the event loop, no store call, no lane.
async def healthz(request: web.Request) -> web.Response:
    problem = request.app[PROBE].problem()
    if problem is not None:
        return _json({"status": "unavailable", "store": problem}, 503)
    return _json({"status": "ok"})


async def livez(_request: web.Request) -> web.Response:
    return _json({"status": "alive"})


async def metrics(request: web.Request) -> web.Response:
    body = await request.app[READS].run(generate_latest, request.app[REGISTRY])
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return resp


def _runs(store: Store, if_none_match: str | None) -> tuple[str, bytes | None]:
    return _hashed({"runs": list_runs(store)}, if_none_match)


async def runs(request: web.Request) -> web.Response:
    return _tagged(*await request.app[READS].run(
        _runs, request.app[STORE], request.headers.get("If-None-Match")))


def _possible_run(request: web.Request) -> str:
    """The run of the path, or a 404 for a name no run can have (without asking the store)."""
    run = request.match_info["run"]
    why = _impossible_run(run)
    if why is not None:
        raise _refuse(request, 404, f"no run {run!r}", why)
    return run


async def _known_run(request: web.Request) -> str:
    run = _possible_run(request)
    if not await request.app[READS].run(run_exists, request.app[STORE], run):
        raise ApiError(404, f"no run {run!r}")
    return run


def _integer(name: str, raw: str, lo: int, hi: int) -> int:
    if not _INTEGER.match(raw):
        raise ApiError(400, f"{name} must be an integer")
    value = int(raw)
    if not lo <= value <= hi:
        raise ApiError(400, f"{name} must be between {lo} and {hi}")
    return value


def _int_param(request: web.Request, name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    return _integer(name, raw, lo, hi)


async def steps(request: web.Request) -> web.Response:
    # parameters first: a bad one is a 400 before the store is asked anything
    lo = _int_param(request, "from", None, -1, INT32_MAX)
    hi = _int_param(request, "to", None, -1, INT32_MAX)
    if lo is not None and hi is not None and lo > hi:
        raise ApiError(400, "from must not be greater than to")
    page = _Page(request.path, lo, hi, _int_param(request, "offset", 0, 0, 2**62),
                 _int_param(request, "limit", PAGE_DEFAULT, 1, PAGE_MAX), _after_param(request),
                 _fields_param(request))
    run = _possible_run(request)
    # one lane job, one connection: the run's state, then the page only when it changed
    answer = await request.app[READS].run(request.app[CONNECTIONS].call, _steps, request.app[BODIES], run,
                                          page, request.query_string, request.headers.get("If-None-Match"))
    if answer is None:
        raise ApiError(404, f"no run {run!r}")
    return _tagged(*answer)


class _Page(NamedTuple):
    """What a /steps request asks for (its path makes the `next` link)."""

    path: str
    lo: int | None
    hi: int | None
    offset: int
    limit: int
    after: tuple[int, int] | None
    fields: tuple[str, ...] | None  # None: every field


def _steps(conn, bodies: BodyCache, run: str, page: _Page, query: str, if_none_match: str | None):
    """(ETag, body or None when the client has it), or None when there is no such run. The
    state is read before the rows: a commit in between makes the tag older than the body (one
    more 200 later), never newer (a client kept on stale rows). A body is kept by its tag: the
    same page of an unchanged run costs the state's query, not the rows'."""
    state = run_state(conn, run)
    if state is None:
        return None
    tag = _etag(run, query, state)
    if _matches(if_none_match, tag):
        return tag, None
    return tag, bodies.kept("steps", tag, lambda: _steps_page(conn, run, page))


def _steps_page(conn, run: str, page: _Page) -> bytes:
    path, lo, hi, offset, limit, after, fields = page
    rows = step_rows(conn, run, lo, hi, offset, limit + 1, after, fields)  # one more: is there a next page?
    nxt = None
    if len(rows) > limit:  # the next page resumes behind the last row (keyset): constant cost per page
        rows = rows[:limit]
        query = {k: v for k, v in (("from", lo), ("to", hi)) if v is not None}
        query |= {"after": f"{rows[-1][0]}:{rows[-1][1]}", "limit": limit}
        if fields is not None:
            query["fields"] = ",".join(fields)
        nxt = f"{path}?{urlencode(query, safe=',')}"
    head = _dumps({"run": run, "from": lo, "to": hi, "offset": offset, "limit": limit,
                   "count": len(rows), "next": nxt})
    return b"".join((head[:-1].encode(), b',"steps":', steps_json(rows, fields), b"}"))


def _fields_param(request: web.Request) -> tuple[str, ...] | None:
    """`fields=ce,ts`: only these of each step (incarnation and step always, they are its key),
    in the order of a whole step; a page of steps and CE alone is a tenth of a whole one."""
    raw = request.query.get("fields")
    if raw is None:
        return None
    asked = {f.strip() for f in raw.split(",") if f.strip()}
    unknown = asked - set(STEP_FIELDS)
    if unknown:
        raise ApiError(400, f"fields: no field {sorted(unknown)[0]!r}; a step has {', '.join(STEP_FIELDS)}")
    return tuple(k for k in STEP_FIELDS if k in asked or k in ("incarnation", "step"))


def _after_param(request: web.Request) -> tuple[int, int] | None:
    raw = request.query.get("after")
    if raw is None:
        return None
    inc, colon, step = raw.partition(":")
    if not colon or not _INTEGER.match(inc) or not _INTEGER.match(step):
        raise ApiError(400, "after must be INCARNATION:STEP")
    return _integer("after's incarnation", inc, 0, INT32_MAX), _integer("after's step", step, -1, INT32_MAX)


def _tagged_findings(conn, run: str, if_none_match: str | None,
                     superseded: bool = False) -> tuple[str, bytes | None] | None:
    """On the lane's connection: a pool checkout costs more than these two small queries."""
    from steptail.storage.findings import load_findings  # loads the detectors: on first use

    if not run_exists_on(conn, run):
        return None
    data = {"run": run, "findings": [f.to_event() for f in load_findings(conn, run)]}
    if superseded:  # the verdicts newer evaluations replaced, and the gate's reference CE
        from steptail.storage.superseded import verdict_history

        data |= verdict_history(conn, run)
    return _hashed(data, if_none_match)


async def findings(request: web.Request) -> web.Response:
    run = _possible_run(request)
    flag = request.query.get("superseded", "0")
    if flag not in ("0", "1"):
        raise ApiError(400, "superseded must be 0 or 1")
    answer = await request.app[READS].run(request.app[CONNECTIONS].call, _tagged_findings, run,
                                          request.headers.get("If-None-Match"), flag == "1")
    if answer is None:
        raise ApiError(404, f"no run {run!r}")
    return _tagged(*answer)


def _tagged_goodput(conn, run: str, if_none_match: str | None) -> tuple[str, bytes | None] | None:
    from steptail.storage.goodput import timing_on

    if not run_exists_on(conn, run):
        return None
    return _hashed(timing_on(conn, run).report(), if_none_match)


async def goodput(request: web.Request) -> web.Response:
    """The fields of `steptail goodput RUN --json` (docs/goodput.md)."""
    run = _possible_run(request)
    answer = await request.app[READS].run(request.app[CONNECTIONS].call, _tagged_goodput, run,
                                          request.headers.get("If-None-Match"))
    if answer is None:
        raise ApiError(404, f"no run {run!r}")
    return _tagged(*answer)


def _mesh(conn, pattern: str | None, since_ns: int | None, until_ns: int | None) -> dict:
    from steptail.storage.mesh import mesh_on

    return {"mesh": mesh_on(conn, pattern, since_ns, until_ns)}


async def mesh(request: web.Request) -> web.Response:
    """`steptail mesh --json` as {"mesh": [...]}; ?run=GLOB&since=&until= (ISO 8601)."""
    from steptail.storage.mesh import iso_ns

    bounds = []
    for name in ("since", "until"):
        raw = request.query.get(name)
        try:
            bounds.append(None if raw is None else iso_ns(raw))
        except ValueError:
            raise ApiError(400, f"{name} must be an ISO 8601 time") from None
    data = await request.app[READS].run(request.app[CONNECTIONS].call, _mesh, request.query.get("run"), *bounds)
    return _json(data)


def _collector_events(conn, run: str | None) -> dict:
    from steptail.storage.collector_events import read_events

    return {"run": run, "collector_events": read_events(conn, run)}


async def collector_events(request: web.Request) -> web.Response:
    """The collector's own faults (health, not the run's findings; storage.collector_events):
    ?run=NAME, that run's and pod discovery's; without it, all; newest first."""
    run = request.query.get("run") or None
    if run is not None and (why := _impossible_run(run)) is not None:
        raise ApiError(400, f"run: {why}")
    return _json(await request.app[READS].run(request.app[CONNECTIONS].call, _collector_events, run))


# -- the web page (steptail/web, docs/page.md) ------------------------------------------------
def _accepts_gzip(request: web.Request) -> bool:
    for item in request.headers.get("Accept-Encoding", "").split(","):
        name, _, params = item.partition(";")
        if name.strip().lower() == "gzip":
            q = params.strip().lower()
            if not q.startswith("q="):
                return True
            try:
                return float(q[2:]) > 0
            except ValueError:
                return False
    return False


async def _asset(request: web.Request, name: str) -> web.Response:
    try:
        found = await asyncio.to_thread(asset, name)  # read (and compressed) once, then cached
    except MissingLibrary as exc:
        raise ApiError(500, str(exc)) from None
    if found is None:
        raise ApiError(404, f"no file {name!r}")
    headers = {"ETag": found.etag, "Cache-Control": "no-cache", "Vary": "Accept-Encoding",
               "X-Content-Type-Options": "nosniff"}
    if name == "index.html":
        headers |= PAGE_HEADERS
    if _matches(request.headers.get("If-None-Match"), found.etag):
        return web.Response(status=304, headers=headers)
    body = found.body
    if _accepts_gzip(request):
        body, headers["Content-Encoding"] = found.gzipped, "gzip"
    return web.Response(body=body, headers=headers, content_type=found.content_type, charset="utf-8")


async def page(request: web.Request) -> web.Response:
    return await _asset(request, "index.html")


async def static(request: web.Request) -> web.Response:
    return await _asset(request, request.match_info["name"])


def _overview(conn, if_none_match: str | None) -> tuple[str, bytes | None]:
    return _hashed({"live_seconds": LIVE_NS // 10**9, "runs": overview(conn, time.time_ns())}, if_none_match)


async def runs_overview(request: web.Request) -> web.Response:
    """The page's runs table: each run's state, last step and CE, findings by severity."""
    return _tagged(*await request.app[READS].run(request.app[CONNECTIONS].call, _overview,
                                                 request.headers.get("If-None-Match")))


def _outline(conn, bodies: BodyCache, store: Store, run: str,
             if_none_match: str | None) -> tuple[str, bytes | None] | None:
    """As _steps: tagged by the run's state, read (on the lane's connection) before the body. The
    body on a connection of its own: its pass over the steps streams, which PostgreSQL does in a
    transaction (the lane's connections are in autocommit)."""
    state = run_state(conn, run)
    if state is None:
        return None
    tag = _etag("outline", run, state)
    if _matches(if_none_match, tag):
        return tag, None
    def make() -> bytes | None:
        with store.engine.connect() as own:
            data = outline(own, run)
        return None if data is None else _dumps(data).encode()

    body = bodies.kept("outline", tag, make)
    return None if body is None else (tag, body)


async def run_outline(request: web.Request) -> web.Response:
    """A run's incarnations, restore points, checkpoints, missing steps and stream gaps."""
    run = _possible_run(request)
    answer = await request.app[READS].run(request.app[CONNECTIONS].call, _outline, request.app[BODIES],
                                          request.app[STORE], run, request.headers.get("If-None-Match"))
    if answer is None:
        raise ApiError(404, f"no run {run!r}")
    return _tagged(*answer)


def _bundle(store: Store, run: str, work: Path) -> Path:
    """Export RUN into WORK and zip it (files at the archive's top, under RUN/)."""
    from steptail.storage.export import check_export_name, export_run

    check_export_name(run)  # a stored name ('../x') must not steer the paths below
    folder = work / run
    export_run(store, run, folder)
    archive = work / f"{run}.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):  # raw/ and archive/ nest
            zf.write(path, f"{run}/{path.relative_to(folder).as_posix()}")
    return archive


async def export(request: web.Request) -> web.StreamResponse:
    from steptail.storage.export import ExportError

    run = await _known_run(request)
    work = Path(tempfile.mkdtemp(prefix="steptail-export-"))
    try:
        try:
            job = request.app[EXPORTS].submit(_bundle, request.app[STORE], run, work)
            try:
                archive = await asyncio.wrap_future(job)
            except asyncio.CancelledError:  # the client left; the thread may still be writing
                job.add_done_callback(lambda _job: shutil.rmtree(work, True))
                raise
        except ExportError as exc:  # e.g. a name another writer stored ('../x')
            raise ApiError(400, str(exc)) from None
        resp = web.StreamResponse(headers={
            "Content-Type": "application/zip",
            "Content-Disposition": f'attachment; filename="{run}.zip"',
            "Content-Length": str(archive.stat().st_size),
        })
        await resp.prepare(request)
        with archive.open("rb") as fh:
            while chunk := await asyncio.to_thread(fh.read, 1 << 20):
                try:
                    await asyncio.wait_for(resp.write(chunk), WRITE_TIMEOUT)
                except TimeoutError:  # the client stopped reading: let its descriptor go
                    if request.transport is not None:
                        request.transport.abort()
                    raise ConnectionResetError("client stopped reading") from None
        await resp.write_eof()
        return resp
    finally:
        await asyncio.to_thread(shutil.rmtree, work, True)


def make_app(store: Store, token: str | None = None, *, export_lane: tuple[int, int, int] = EXPORT_LANE,
             read_lane: tuple[int, int, int] = READ_LANE, probe_interval: float = PROBE_INTERVAL) -> web.Application:
    """The application; lanes are (threads, waiting requests, Retry-After seconds)."""
    app = web.Application(middlewares=[_guard])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    app[STORE] = store
    app[TOKEN] = token or None
    app[REGISTRY] = registry
    app[ANSWERING] = set()
    app[PROBE] = StoreProbe(store, probe_interval, max(PROBE_STALE, 3 * probe_interval))
    app[EXPORTS] = Lane("export", *export_lane)
    app[READS] = Lane("read", *read_lane)
    app[CONNECTIONS] = LaneConnections(store)
    app[BODIES] = BodyCache()
    registry.register(LaneCollector(app[EXPORTS], app[READS]))
    registry.register(BodyCacheCollector(app[BODIES]))
    app.cleanup_ctx.append(app[PROBE].context)
    app.on_cleanup.append(_shutdown_lanes)
    r = app.router
    r.add_get("/healthz", healthz)
    r.add_get("/livez", livez)
    r.add_get("/metrics", metrics)
    r.add_get("/api/runs", runs)
    r.add_get("/api/runs/{run}/steps", steps)
    r.add_get("/api/runs/{run}/findings", findings)
    r.add_get("/api/runs/{run}/export", export)
    r.add_get("/api/runs/{run}/goodput", goodput)
    r.add_get("/api/runs/{run}/outline", run_outline)
    r.add_get("/api/overview", runs_overview)
    r.add_get("/api/collector-events", collector_events)
    r.add_get("/api/mesh", mesh)
    r.add_get("/", page)
    r.add_get("/static/{name}", static)
    return app


async def _shutdown_lanes(app: web.Application) -> None:
    app[EXPORTS].shutdown()
    app[READS].shutdown()
    app[CONNECTIONS].close()


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
