"""The Kubernetes API over HTTPS (aiohttp): routes, query parameters, Status error bodies,
bearer-token auth and the API faults (faults.py). Handlers read ClusterState under its lock;
the body of pods/log comes from logs.stream."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from steptail.simcluster import discovery, kube, logs, render
from steptail.simcluster.hostile import Hostile
from steptail.simcluster.objects import CONTAINER
from steptail.simcluster.state import ClusterState

USER = web.RequestKey("user", str)  # the account a request authenticated as
ASKED = web.RequestKey("asked", float)  # when the request arrived, before any injected delay
WAKE_SILENCE = 0.5  # seconds without a request from an account before its next one is a wake
WATCH_POLL = 0.02  # seconds between two looks of an open watch for new events

_FAILURE_MESSAGES = {
    429: "Too many requests, please try again later.",  # API Priority and Fairness
    500: "an error on the server (\"unknown\") has prevented the request from succeeding",
    503: "the server is currently unable to handle the request",
}


def status(code: int, message: str, reason: str | None = None, details: dict | None = None) -> web.Response:
    return web.json_response(kube.status_body(code, message, reason, details), status=code)


def injected(code: int, retry_after: int | None) -> web.Response:
    """An injected failure as the apiserver writes it: with retry_after, `details.retryAfterSeconds`
    and the `Retry-After` header (responsewriters sets the header from the details; client-go,
    hence kubectl, then waits and retries by itself, up to 10 times)."""
    details = {"retryAfterSeconds": retry_after} if retry_after else None
    resp = status(code, _FAILURE_MESSAGES.get(code, f"simulated failure {code}"), details=details)
    if retry_after:
        resp.headers["Retry-After"] = str(retry_after)
    return resp


def _not_found(kind: str, name: str, group: str | None = None) -> web.Response:
    details = {"name": name, "kind": kind} if group is None else {"name": name, "group": group, "kind": kind}
    return status(404, f'{kind}{"." + group if group else ""} "{name}" not found', details=details)


def _wants_table(request: web.Request) -> bool:
    return "as=Table" in request.headers.get("Accept", "")


def _is_watch(request: web.Request) -> bool:
    return request.query.get("watch") in ("true", "1", "True")


# resource -> (kind, apiVersion) of its objects
_KINDS = {"pods": ("Pod", "v1"), "jobsets": ("JobSet", render.JOBSET_API), "workloads": ("Workload", render.WORKLOAD_API)}


@dataclass
class LogRead:
    """One pods/log request: who (the account), which pod, follow or not, wall-clock span."""

    user: str
    namespace: str
    pod: str
    follow: bool
    previous: bool
    start: float
    end: float | None = None  # None while the stream is open
    asked: float = 0.0  # when the request arrived (start: when answered, after a slow API's delay)


class KubeApi:
    def __init__(self, state: ClusterState, token: str, watch_timeout: float) -> None:
        self.state = state
        self.token = token  # the bearer token the exec plugin hands kubectl
        self.watch_timeout = watch_timeout  # server-side end of a watch without timeoutSeconds
        self.address = ""  # host:port once listening
        self.closing = False  # set by close(): open streams end
        # every request: (asked, answered, user, method, path?query, status); a failing chaos
        # seed's story is in it (when a follower asked again after a fault, and what for)
        self.timeline: list[tuple[float, float, str, str, str, int]] = []
        self.log_reads: list[LogRead] = []  # every pods/log request, who made it, from when to when
        # account -> when it last asked, and when it began asking after a silence of WAKE_SILENCE
        # (the last 100): when a restarted client was up again (the chaos harness)
        self.last_asked: dict[str, float] = {}
        self.woke: dict[str, list[float]] = {}
        self._runner: web.AppRunner | None = None
        self.hostile = Hostile()  # tests: what a hostile API server serves (hostile.py)

    async def listen(self, host: str, port: int, cert: Path, key: Path) -> int:
        """Serve HTTPS on host:port (0: ephemeral); returns the bound port."""
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(cert), str(key))
        ctx.set_alpn_protocols(["http/1.1"])
        app = web.Application(middlewares=[self._middleware])
        self._add_routes(app.router)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=ctx)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.address = f"{host}:{port}"
        return port

    async def close(self) -> None:
        self.closing = True
        if self._runner is not None:
            await self._runner.cleanup()
        self._runner = None

    def _add_routes(self, router: web.UrlDispatcher) -> None:
        g = router.add_get
        for path, doc in discovery.STATIC.items():
            g(path, self._static(doc))
        g("/api", self.h_api)
        g("/api/v1/namespaces", self.h_namespaces)
        g("/api/v1/namespaces/{ns}", self.h_namespace)
        g("/api/v1/pods", self.h_pods)
        g("/api/v1/namespaces/{ns}/pods", self.h_pods)
        g("/api/v1/namespaces/{ns}/pods/{name}", self.h_pod)
        g("/api/v1/namespaces/{ns}/pods/{name}/log", self.h_log)
        g("/apis/jobset.x-k8s.io/v1alpha2/jobsets", self.h_jobsets)
        g("/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets", self.h_jobsets)
        g("/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets/{name}", self.h_jobset)
        g("/apis/kueue.x-k8s.io/v1beta1/workloads", self.h_workloads)
        g("/apis/kueue.x-k8s.io/v1beta1/namespaces/{ns}/workloads", self.h_workloads)
        g("/apis/kueue.x-k8s.io/v1beta1/namespaces/{ns}/workloads/{name}", self.h_workload)
        router.add_route("*", "/{tail:.*}", self.h_notfound)

    # ---- every request: auth, injected failures, the request log
    @web.middleware
    async def _middleware(self, request: web.Request, handler):
        path = request.path
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        request[ASKED] = time.time()
        await self._held(str(request.rel_url))  # slow_api / hang_api match path and query
        user = self.user(request.headers.get("Authorization", ""))
        request[USER] = user
        faults = self.state.faults
        with self.state.lock:
            self._asked(user, request[ASKED])
            if user is None or faults.lapsed():
                fail = 401
            else:
                fail = faults.take_failure(str(request.rel_url))  # path and query, as slow_api
        if fail == 401:
            resp = status(401, "Unauthorized")
        elif fail is not None:
            resp = injected(*fail)
        elif (garbage := self.hostile.garbage(request)) is not None:
            resp = garbage
        else:
            try:
                resp = await handler(request)
            except web.HTTPException as e:
                resp = e
        with self.state.lock:
            self.timeline.append((request[ASKED], time.time(), user or "", request.method, str(request.rel_url),
                                  resp.status))
            if len(self.timeline) > 20000:
                del self.timeline[:10000]
        return resp

    def _asked(self, user: str | None, at: float) -> None:
        """Note when `user` asked (`at`: on arrival, before any injected delay); the caller
        holds the state lock."""
        if not user:
            return
        if at - self.last_asked.get(user, float("-inf")) >= WAKE_SILENCE:
            wakes = self.woke.setdefault(user, [])
            wakes.append(at)
            del wakes[:-100]
        self.last_asked[user] = max(at, self.last_asked.get(user, at))

    async def _held(self, path: str) -> None:
        """slow_api: the answer comes `delay` late; hang_api: no answer while the hang lasts
        (a client that gives up meanwhile cancels the handler)."""
        faults = self.state.faults
        while True:
            with self.state.lock:
                hanging = not self.closing and faults.hanging(path)
                delay = 0.0 if hanging else faults.delay(path)
            if not hanging:
                break
            await asyncio.sleep(WATCH_POLL)
        if delay > 0:
            await asyncio.sleep(delay)

    def user(self, auth: str) -> str | None:
        """Who a bearer token belongs to (the account the exec plugin was run as; "" for the
        bare token), or None when it is not this cluster's."""
        token, _, account = auth.removeprefix("Bearer ").partition(".")
        if not auth.startswith("Bearer ") or not secrets.compare_digest(token, self.token):
            return None
        try:
            return base64.urlsafe_b64decode(account + "=" * (-len(account) % 4)).decode() if account else ""
        except (ValueError, UnicodeDecodeError):
            return None

    async def h_notfound(self, request: web.Request) -> web.Response:
        if request.method != "GET":
            return status(405, f"the server does not allow this method on the requested resource "
                               f"(simulated cluster is read-only: {request.method})", "MethodNotAllowed")
        return status(404, "the server could not find the requested resource")

    # ---- discovery and namespaces
    @staticmethod
    def _static(doc: dict):
        async def handler(request: web.Request) -> web.Response:
            return web.json_response(doc)
        return handler

    async def h_api(self, request: web.Request) -> web.Response:
        return web.json_response(discovery.api_versions(self.address))

    async def h_namespaces(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "NamespaceList", "apiVersion": "v1",
                                  "metadata": {"resourceVersion": str(self.state.rv)},
                                  "items": [render.namespace_json(n) for n in self.state.namespaces()]})

    async def h_namespace(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        if ns not in self.state.namespaces():
            return _not_found("namespaces", ns)
        return web.json_response(render.namespace_json(ns))

    # ---- pods, JobSets and Kueue Workloads: list, watch, get
    async def h_pods(self, request: web.Request) -> web.StreamResponse:
        return await self._list_or_watch(request, "pods")

    async def h_jobsets(self, request: web.Request) -> web.StreamResponse:
        return await self._list_or_watch(request, "jobsets")

    async def h_workloads(self, request: web.Request) -> web.StreamResponse:
        return await self._list_or_watch(request, "workloads")

    def _denied(self, request: web.Request, kind: str) -> web.Response | None:
        """403 like RBAC gives during a `deny` fault (pods only; single-pod reads still work)."""
        with self.state.lock:
            user = self.state.faults.denied_user() if kind == "pods" else None
        if user is None:
            return None
        verb = "watch" if _is_watch(request) else "list"
        ns = request.match_info.get("ns")
        where = f'in the namespace "{ns}"' if ns else "at the cluster scope"
        return status(403, f'pods is forbidden: User "{user}" cannot {verb} resource "pods" in API group "" '
                           f"{where}", details={"kind": "pods"})

    def _served(self, o: dict) -> dict:
        """A pod as list/watch serve it: during corrupt_pods, with a timestamp no client parses."""
        o = self.hostile.served(o)
        if not self.state.faults.corrupting() or o.get("kind") != "Pod":
            return o
        return {**o, "metadata": {**o["metadata"], "creationTimestamp": "not-a-timestamp"}}

    async def _list_or_watch(self, request: web.Request, kind: str) -> web.StreamResponse:
        if (denied := self._denied(request, kind)) is not None:
            return denied
        q = request.query
        ns = request.match_info.get("ns")
        try:
            lsel = kube.parse_selector(q.get("labelSelector"))
            fsel = kube.parse_field_selector(q.get("fieldSelector"))
        except ValueError as e:
            return status(400, str(e))

        def match(o):
            return (ns is None or o["metadata"]["namespace"] == ns) and lsel(o["metadata"].get("labels", {})) \
                and fsel(o)

        if _is_watch(request):
            return await self._watch(request, kind, match)
        with self.state.lock:
            items = [o for o in self.state.snapshot(kind, ns) if match(o)]
            rv = self.state.rv
            items, more = self.hostile.page(self.hostile.listed(items, match, ns) if kind == "pods" else items, q)
        if _wants_table(request):
            return web.json_response(render.table(kind, items, rv))
        obj_kind, api = _KINDS[kind]
        return web.json_response({"kind": obj_kind + "List", "apiVersion": api,
                                  "metadata": {"resourceVersion": str(rv), **({"continue": more} if more else {})},
                                  "items": [self._served(o) for o in items]})

    async def _watch(self, request: web.Request, kind: str, match) -> web.StreamResponse:
        """Events after `resourceVersion` (none or 0: ADDED for every current object first),
        until timeoutSeconds, eof_streams or shutdown."""
        st = self.state
        q = request.query
        rv_param = q.get("resourceVersion", "")
        timeout = float(q.get("timeoutSeconds") or self.watch_timeout)
        deadline = time.monotonic() + timeout
        with st.lock:
            if rv_param in ("", "0"):
                initial = [("ADDED", o) for o in st.snapshot(kind, request.match_info.get("ns")) if match(o)]
                since = st.rv
            else:
                try:
                    since = int(rv_param)
                except ValueError:
                    return status(400, f"invalid resourceVersion {rv_param!r}")
                initial = []
            eof_gen = st.faults.eof_gen
            gens = (st.faults.abort_gen, st.faults.watch_drop_gen, st.faults.gone_gen)
            # watch_gone compacted the history: an older resourceVersion is expired at once
            expired = since < st.faults.compacted_rv
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        table = _wants_table(request)
        first = [True]
        # allowWatchBookmarks: a BOOKMARK (only metadata.resourceVersion: every event up to it
        # was sent) every bookmark_seconds and when the watch times out, as the apiserver's cache
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1", "True") and not table
        bookmark_every = max(0.05, float(st.scenario.bookmark_seconds))
        next_bookmark = time.monotonic() + bookmark_every

        def bookmark() -> bytes:
            obj_kind, api = _KINDS[kind]
            return json.dumps({"type": "BOOKMARK", "object": {
                "kind": obj_kind, "apiVersion": api, "metadata": {"resourceVersion": str(since)}}}).encode() + b"\n"

        def encode(typ: str, o: dict) -> bytes:
            if table:  # kubectl get -w: each event carries a one-row Table
                o = render.table(kind, [o], int(o["metadata"]["resourceVersion"]))
                if not first[0]:
                    o["columnDefinitions"] = []
                first[0] = False
            else:
                o = self._served(o)
            return json.dumps({"type": typ, "object": o}).encode() + b"\n"

        def gone() -> bytes:
            """The ERROR event the apiserver sends when the watch's resourceVersion was compacted."""
            body = kube.status_body(410, f"too old resource version: {since} ({st.faults.compacted_rv})", "Expired")
            return json.dumps({"type": "ERROR", "object": body}).encode() + b"\n"

        try:
            if expired:
                await resp.write(gone())
                await resp.write_eof()
                return resp
            for typ, o in initial:
                await resp.write(encode(typ, o))
            idx = 0
            while time.monotonic() < deadline and not self.closing:
                with st.lock:
                    f = st.faults
                    if f.eof_gen != eof_gen:
                        break
                    dropped = (f.abort_gen, f.watch_drop_gen) != gens[:2]
                    compacted = f.gone_gen != gens[2]
                    held = f.hanging(str(request.rel_url), stream=True)
                if dropped:  # the connection goes, without the final chunk
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
                if compacted:
                    await resp.write(gone())
                    break
                if held:
                    await asyncio.sleep(WATCH_POLL)
                    continue
                with st.lock:
                    # events are appended in rv order
                    while idx < len(st.events) and st.events[idx][0] <= since:
                        idx += 1
                    new = st.events[idx:]
                    idx = len(st.events)
                for erv, k, typ, o in new:
                    since = erv
                    if k == kind and match(o):
                        await resp.write(encode(typ, o))
                if bookmarks and time.monotonic() >= next_bookmark:
                    next_bookmark = time.monotonic() + bookmark_every
                    await resp.write(bookmark())
                await asyncio.sleep(WATCH_POLL)
            if bookmarks and time.monotonic() >= deadline and not self.closing:
                await resp.write(bookmark())
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return resp

    async def h_pod(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        with self.state.lock:
            p = self.state.pods.get((ns, name))
            obj = render.pod_json(p) if p else self.hostile.pod(ns, name)
        if obj is None:
            return _not_found("pods", name)
        if _wants_table(request):
            return web.json_response(render.pod_table([obj], self.state.rv))
        return web.json_response(self.hostile.served(obj))

    async def h_jobset(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        with self.state.lock:
            js = self.state.jobsets.get((ns, name))
            obj = render.jobset_json(js) if js else None
        if obj is None:
            return _not_found("jobsets", name, group="jobset.x-k8s.io")
        if _wants_table(request):
            return web.json_response(render.jobset_table([obj], self.state.rv))
        return web.json_response(obj)

    async def h_workload(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        with self.state.lock:
            obj = next((render.workload_json(js) for js in self.state.jobsets.values()
                        if js.workload is not None and js.spec.namespace == ns and js.workload.name == name), None)
        if obj is None:
            return _not_found("workloads", name, group="kueue.x-k8s.io")
        if _wants_table(request):
            return web.json_response(render.workload_table([obj], self.state.rv))
        return web.json_response(obj)

    # ---- pods/log
    async def h_log(self, request: web.Request) -> web.StreamResponse:
        ns, name = request.match_info["ns"], request.match_info["name"]
        q = request.query

        def flag(k):
            return q.get(k, "false").lower() in ("true", "1")

        follow, timestamps, previous = flag("follow"), flag("timestamps"), flag("previous")
        container = q.get("container") or CONTAINER
        try:
            since_ns = None
            if q.get("sinceTime"):
                since_ns = kube.parse_rfc3339_ns(q["sinceTime"])
            since_seconds = int(q["sinceSeconds"]) if q.get("sinceSeconds") else None
            if since_seconds is not None and since_seconds < 1:
                return status(400, "sinceSeconds must be greater than 0")
            tail = int(q["tailLines"]) if q.get("tailLines") else None
            limit = int(q["limitBytes"]) if q.get("limitBytes") else None
        except ValueError as e:
            return status(400, f"invalid log options: {e}")
        st = self.state
        with st.lock:
            p = st.pods.get((ns, name))
            if p is None:
                return _not_found("pods", name)
            if container != CONTAINER:
                return status(400, f"container {container} is not valid for pod {name}")
            if previous:
                inst = p.previous
                if inst is None:
                    return status(400, f'previous terminated container "{container}" in pod "{name}" not found')
            else:
                inst = p.current
                if inst.state == "waiting":
                    return status(400, f'container "{container}" in pod "{name}" is waiting to start: '
                                       f"{inst.reason}")
            log = inst.log
            if since_seconds is not None:  # kubelet computes it on its node's clock
                since_ns = time.time_ns() + p.clock_offset_ns - since_seconds * 1_000_000_000
            start = log.cur_start  # kubelet serves the current file only
            if tail is not None:
                start = max(start, log.end - tail)
            gen = log.gen
            eof_gen, abort_gen = st.faults.eof_gen, st.faults.abort_gen

        def ended() -> bool:
            return self.closing or st.faults.eof_gen != eof_gen or aborted()

        def aborted() -> bool:  # eof_streams(abort=True): dropped, not ended
            return st.faults.abort_gen != abort_gen

        def frozen() -> bool:  # hang_api with streams: nothing more is sent meanwhile
            return st.faults.hanging(str(request.rel_url), stream=True)

        read = LogRead(request.get(USER) or "", ns, name, follow and not previous, previous, time.time(),
                       asked=request.get(ASKED) or time.time())
        with st.lock:
            self.log_reads.append(read)
        try:
            return await logs.stream(request, log, st.lock, gen=gen, start=start, follow=follow and not previous,
                                     timestamps=timestamps, since_ns=since_ns, limit=limit, ended=ended,
                                     aborted=aborted, frozen=frozen)
        finally:
            read.end = time.time()
