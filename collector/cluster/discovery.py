"""Finding JAX process 0 of each JobSet: list + watch of pods (and of JobSets for `--all`)
with the `kubernetes` client, on daemon threads, handing snapshots to the event loop.

The client is blocking; each watch runs on its own thread with a short server-side timeout
so it notices `stop()` within seconds. Every change wakes the followers (`changed`). Failing
and recovering is tracked in `health` (one log line per change, counted by kind).

What the API sends is input: lists are read `page_size` pods at a time (`limit`/`continue`),
each pod is read on the watch's thread, and a pod whose names are unsafe (runs.names: its
JobSet label, which becomes a run name, its name, uid or container) or whose object cannot
be read is refused — kept out of `pods`, one log line per name (at most REFUSED_LOGGED, then
counted only), `on_refused` told once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
import time
from dataclasses import dataclass, field

# Named imports, at import time: the client loads its API and model modules lazily, on
# first attribute access, and that takes about half a second (pydantic models) which inside
# the event loop would stall every stream.
from kubernetes import watch
from kubernetes.client import V1Pod  # the watch's type
from kubernetes.client.exceptions import ApiException
from kubernetes.config import ConfigException
from urllib3.exceptions import HTTPError, MaxRetryError

from steptail.collector.cluster.kubeclient import KubeconfigError, api_client, exec_failure
from steptail.collector.cluster.kubectl import KubeTarget, classify
from steptail.collector.cluster.pods_api import PodsApi, pods_api
from steptail.collector.notify.health import Backoff, Health, Recovery
from steptail.parsers.timestamps import parse_rfc3339
from steptail.runs.names import RunNameError, check_cluster_name, check_run_name, shown

JOBSET = "jobset.sigs.k8s.io/jobset-name"
ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
PROCESS0 = "jobset.sigs.k8s.io/job-index=0,batch.kubernetes.io/job-completion-index=0"
TOPOLOGY = "cloud.google.com/gke-tpu-topology"
WATCH_SECONDS = 5
# longest wait between list/watch retries (seconds). Low: a failing list is one cheap
# request, and every second discovery waits is a second no new pod is read. At 2 s a burst
# of six 5xx answers took 0.25+0.5+1+2+2+2 = 7.75 s to get through (chaos seed 111: the head
# file rotated away meanwhile); at 0.5 s it is through in 2.75 s, and a lasting outage costs
# two failed lists a second.
BACKOFF_MAX = 0.5
PAGE_SIZE = 500  # pods per list request: a namespace of 20,000 pods is read 500 models at a time
# Bytes of one list answer read before it is refused: 500 pods are a few MB (a GKE TPU pod ~10 KB
# with its managed fields). An answer past this is a server that ignored `limit` (a 55 MB list
# cost 700 MB and stalled the event loop 10 s): refused before it is parsed, as a list failure.
MAX_PAGE_BYTES = 16 << 20
READ_CHUNK = 1 << 20
REFUSED_LOGGED = 20  # refused names logged one line each; beyond, counted (metric, summary) only
REFUSED_KEPT = 1000  # refused names remembered (for the summary); beyond, counted only
# how long a stop waits for the watch threads to end. They are daemons, but one still inside
# the client (a plugin run, a request) when the interpreter finalizes can take the process
# down with it (a CI run saw SIGABRT at exit); a halted watch ends in milliseconds, a request
# to a hung API server within its own timeout, so this bounds what a hang adds to an exit.
JOIN_SECONDS = 3.0
ATTEMPT_VALUE = re.compile(r"[0-9]{1,9}\Z")  # ASCII digits: int() would take '١٥' or '+1'
log = logging.getLogger("steptail.follow")


@dataclass(frozen=True)
class PodInfo:
    """What a follower needs to know about one process-0 pod."""

    name: str
    uid: str
    jobset: str
    attempt: int
    created: str
    phase: str
    deleting: bool
    container: str
    restart_count: int
    state: str  # waiting | running | terminated
    reason: str  # waiting / terminated reason
    finished_ns: int | None  # current container's finishedAt
    started_ns: int | None  # current container's startedAt (whole seconds)
    previous_finished_ns: int | None  # lastState.terminated.finishedAt
    previous_started_ns: int | None = None  # lastState.terminated.startedAt (whole seconds)
    created_ns: int | None = None  # creationTimestamp (whole seconds)
    image: str = ""  # the followed container's image, as the spec names it
    image_id: str = ""  # what the kubelet ran (status imageID: the digest)
    topology: str = ""  # node selector cloud.google.com/gke-tpu-topology
    # the pod as the runbook rules read it (runs.manifest.live_pod): labels, containers,
    # node selector and gcsfuse volumes only
    view: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def order(self) -> tuple:
        return (self.attempt, self.created, self.name)


def _ns(t) -> int | None:
    if t is None:
        return None
    if isinstance(t, str):
        return parse_rfc3339(t)
    return int(t.timestamp() * 1e9)


def pod_info(pod) -> PodInfo:
    meta, spec, status = pod.metadata, pod.spec, pod.status
    labels = meta.labels or {}
    container = spec.containers[0].name if spec and spec.containers else ""
    cs = None
    for c in (status.container_statuses or []) if status else []:
        if c.name == container:
            cs = c
    state, reason, finished, prev_finished, rc, started = "waiting", "Pending", None, None, 0, None
    prev_started = None
    if cs is not None:
        rc = cs.restart_count or 0
        if cs.state and cs.state.running:
            state, reason, started = "running", "", _ns(cs.state.running.started_at)
        elif cs.state and cs.state.terminated:
            t = cs.state.terminated
            state, reason, finished = "terminated", t.reason or "", _ns(t.finished_at)
            started = _ns(t.started_at)
        elif cs.state and cs.state.waiting:
            reason = cs.state.waiting.reason or "Waiting"
        if cs.last_state and cs.last_state.terminated:
            prev_finished = _ns(cs.last_state.terminated.finished_at)
            prev_started = _ns(cs.last_state.terminated.started_at)
    value = labels.get(ATTEMPT, "0")
    attempt = int(value) if isinstance(value, str) and ATTEMPT_VALUE.match(value) else 0
    view = rules_view(pod)
    selector = view["spec"]["nodeSelector"]
    return PodInfo(
        name=meta.name, uid=meta.uid, jobset=labels.get(JOBSET, ""), attempt=attempt,
        created=str(meta.creation_timestamp), phase=(status.phase if status else "") or "",
        deleting=meta.deletion_timestamp is not None, container=container, restart_count=rc,
        state=state, reason=reason, finished_ns=finished, started_ns=started,
        previous_finished_ns=prev_finished, previous_started_ns=prev_started,
        created_ns=_ns(meta.creation_timestamp), image=str(spec.containers[0].image or "") if spec and spec.containers else "",
        image_id=str(cs.image_id or "") if cs is not None else "",
        topology=str(selector.get(TOPOLOGY, "")), view=view,
    )


def rules_view(pod) -> dict:
    """The parts of a pod (a client model) the runbook rules read, as the API's JSON."""
    meta, spec = pod.metadata, pod.spec
    containers = []
    for c in (spec.containers or []) if spec else []:
        res = c.resources
        containers.append({"name": c.name, "image": c.image, "command": list(c.command or []),
                           "args": list(c.args or []),
                           "resources": {"limits": dict(res.limits or {}) if res else {},
                                         "requests": dict(res.requests or {}) if res else {}}})
    volumes = []
    for v in (spec.volumes or []) if spec else []:
        if v.csi is not None:
            volumes.append({"name": v.name, "csi": {"driver": v.csi.driver,
                                                     "volumeAttributes": dict(v.csi.volume_attributes or {})}})
    return {"metadata": {"name": meta.name, "labels": dict(meta.labels or {}),
                         "annotations": dict(meta.annotations or {})},
            "spec": {"containers": containers, "nodeSelector": dict((spec.node_selector or {}) if spec else {}),
                     "volumes": volumes}}


@dataclass(frozen=True)
class Refusal:
    """A pod discovery does not follow: `key` names what was refused (e.g. 'JobSet …')."""

    key: str
    reason: str  # one line, safe to show
    uid: str = ""  # the pod's, when it could be read


def read_pod(pod) -> PodInfo | Refusal:
    """The pod as followers see it, or why it is refused (an unsafe name, an unreadable object)."""
    try:
        info = pod_info(pod)
    except Exception as exc:  # noqa: BLE001 - any shape the models let through: one refusal
        return Refusal("pod object", f"unreadable pod object: {type(exc).__name__}: {str(exc)[:150]}")
    try:
        if info.jobset:  # the run name of an --all follower: the CLI's own check
            check_run_name(info.jobset)
    except RunNameError as exc:
        return Refusal(f"JobSet {shown(info.jobset)}", f"JobSet label of pod {shown(info.name)}: {exc}", str(info.uid))
    try:
        for kind, value in (("pod", info.name), ("uid", info.uid), ("container", info.container)):
            check_cluster_name(kind, value)
    except RunNameError as exc:
        return Refusal(f"{kind} {shown(value)}", f"pod {shown(info.name)} (JobSet {shown(info.jobset)}): {exc}",
                       str(info.uid))
    return info


def api_message(exc: Exception) -> str:
    """The API's own words for a failed request: the `message` of its Status body."""
    try:
        body = json.loads(getattr(exc, "body", None) or "")
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(getattr(exc, "reason", "") or "").strip()


def retry_after(exc: Exception) -> float | None:
    """Seconds a refused request's answer asked to wait (`Retry-After`, as API Priority and
    Fairness and a 503 write it; else the Status' `details.retryAfterSeconds`), None if it
    named none: the caller then backs off by its own rule."""
    headers = getattr(exc, "headers", None) or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    if value is None:
        try:
            body = json.loads(getattr(exc, "body", None) or "")
            value = body.get("details", {}).get("retryAfterSeconds") if isinstance(body, dict) else None
        except (TypeError, ValueError, AttributeError):
            value = None
    try:
        seconds = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None  # an HTTP date, or garbage: our own rule
    return seconds if seconds is not None and seconds >= 0 else None


_OBJECT = re.compile(r"<[\w.]+ object at 0x[0-9a-f]+>:?\s*")  # urllib3's repr of the connection


def _lines(text, n: int = 3) -> str:
    text = _OBJECT.sub("", str(text))
    return "; ".join(ln.strip() for ln in text.splitlines()[:n] if ln.strip())[:300]


def reason_of(exc: Exception) -> tuple[str, str]:
    """(kind, reason) of a failed API call: auth (401), forbidden (403), server_error (5xx),
    deserialize (objects the client cannot read), network, config, or kubectl's kinds."""
    status = getattr(exc, "status", None)
    if isinstance(exc, ApiException) and status == 401:
        plugin = exec_failure()
        if plugin is not None:
            return "auth", f"{plugin} (Kubernetes API answered 401)"
        return "auth", f"{api_message(exc) or 'Unauthorized'} (401)"
    if isinstance(exc, ApiException) and status == 403:
        return "forbidden", f"{api_message(exc) or 'Forbidden'} (403)"
    if isinstance(exc, ApiException) and isinstance(status, int) and (status >= 500 or status == 429):
        # 429: throttled (API Priority and Fairness), a server error to the run's health
        return "server_error", f"{api_message(exc)} ({status})"
    if isinstance(exc, ValueError | TypeError) or (isinstance(exc, ApiException) and status == 0):
        # TypeError: a body that is not JSON, which the client hands its models as a string
        # pydantic's ValidationError is a ValueError: an object the client's models refuse
        return "deserialize", f"cannot read the API's pod objects: {_lines(exc.reason if status == 0 else exc)}"
    if isinstance(exc, MaxRetryError) and exc.reason is not None:
        return "network", _lines(exc.reason, 1)
    if isinstance(exc, HTTPError | OSError):
        return "network", _lines(exc, 1)
    if isinstance(exc, KubeconfigError | ConfigException):
        return "config", _lines(exc, 1)
    return classify(str(exc))


class _Watcher(threading.Thread):
    """list + watch one resource on a thread; `apply(kind, items|event)` runs on the loop.

    `connect()` builds the client (running the credential plugin) and returns the list
    function; it is called again after a 401, so credentials that failed come back."""

    def __init__(self, name: str, loop: asyncio.AbstractEventLoop, connect, on_list, on_event, on_error,
                 page_size: int = PAGE_SIZE, read=read_pod, return_type: str = "V1Pod",
                 backoff_max: float = BACKOFF_MAX, recovery: Recovery | None = None):
        super().__init__(name=name, daemon=True)
        self.recovery = recovery  # the cluster's shared health: a recovery elsewhere ends our wait
        self.loop, self.connect, self.page_size, self.read = loop, connect, page_size, read
        self.return_type = return_type  # "object": custom resources, as plain dicts
        self.backoff_max = backoff_max
        self.on_list, self.on_event, self.on_error = on_list, on_event, on_error
        self.stopping = threading.Event()
        self._watch: watch.Watch | None = None  # the current watch, for halt() to cut

    def halt(self) -> None:
        """Stop, now: the flag, and the open watch's socket shut for reading, so a stream
        waiting for its next event (up to WATCH_SECONDS) ends at once."""
        self.stopping.set()
        resp = getattr(self._watch, "_resp", None)  # the client keeps the open response there
        if resp is not None:
            with contextlib.suppress(Exception):  # already closed or released: it is ending anyway
                resp.shutdown()

    def _post(self, fn, *args) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # loop closed: we are shutting down
            self.stopping.set()

    def run(self) -> None:
        # the follower's rule (health.Backoff): per kind of failure, reset by a success, capped
        # low: a list is one cheap request, and a late list is a pod read late or never
        backoff = Backoff()
        list_fn = None
        while not self.stopping.is_set():
            try:
                if list_fn is None:
                    list_fn = self.connect()
                items, rv = self._list(list_fn)
                self._post(self.on_list, items)
                backoff.ok()
                while not self.stopping.is_set():
                    w = self._watch = watch.Watch(return_type=self.return_type)
                    for ev in w.stream(list_fn, resource_version=rv, timeout_seconds=WATCH_SECONDS,
                                       _request_timeout=WATCH_SECONDS + 10):
                        if self.stopping.is_set():
                            w.stop()
                            break
                        if not isinstance(ev, dict) or not isinstance(ev.get("object"), V1Pod | dict):
                            # the client yields None for a line that is not JSON
                            raise ValueError(f"a watch event that is not a{' pod' if self.return_type == 'V1Pod' else 'n object'}: {str(ev)[:100]}")
                        if ev["type"] == "ERROR":
                            if _gone(ev):
                                raise ApiException(status=410, reason="Gone")
                            raise RuntimeError(f"watch error: {ev.get('raw_object')}")
                        rv = _rv_obj(ev["object"]) or rv
                        self._post(self.on_event, ev["type"], self.read(ev["object"]))
                        backoff.ok()
            except Exception as exc:  # noqa: BLE001 - any failure: report, back off, re-list
                if self.stopping.is_set():
                    break
                status = getattr(exc, "status", None)
                if isinstance(exc, ApiException) and status == 410:
                    continue  # the watch's resourceVersion expired: an ordinary re-list, at once
                if status == 401 or isinstance(exc, KubeconfigError | ConfigException):
                    list_fn = None
                kind, reason = reason_of(exc)
                self._post(self.on_error, kind, reason)
                backoff.fail(kind, retry_after(exc))
                if self.recovery is not None:
                    self.recovery.wait_blocking(backoff.delay(self.backoff_max), self.stopping)
                else:
                    self.stopping.wait(backoff.delay(self.backoff_max))

    def _list(self, list_fn) -> tuple[list, str | None]:
        """Every item, read page by page (`limit`/`continue`): the client's models of one page
        at a time, never the whole namespace's, and a page of at most MAX_PAGE_BYTES."""
        items, token = [], None
        while True:
            kw = {"limit": self.page_size, "_continue": token} if token else {"limit": self.page_size}
            listing = self._page(list_fn, kw)
            items += [self.read(o) for o in _items(listing)]
            meta = listing["metadata"] if isinstance(listing, dict) else listing.metadata
            token = meta.get("continue") if isinstance(meta, dict) else meta._continue
            if not token or self.stopping.is_set():
                return items, _rv(listing)


    def _page(self, list_fn, kw: dict) -> dict:
        """One list answer, its body read raw and bounded (the client would parse any size),
        then its items made the client's models (V1Pod) or kept as dicts (custom objects)."""
        resp = list_fn(_request_timeout=15, _preload_content=False, **kw)
        try:
            body = read_bounded(resp, MAX_PAGE_BYTES, kw["limit"])
        except BaseException:
            resp.close()  # the rest of the answer unread: its connection is dropped, not reused
            raise
        resp.release_conn()
        listing = json.loads(body)  # not JSON: a ValueError, a `deserialize` failure
        if not isinstance(listing, dict) or not isinstance(listing.get("items"), list) \
                or not isinstance(listing.get("metadata", {}), dict):
            raise ValueError(f"a list answer that is not a list: {body[:100]!r}")
        listing.setdefault("metadata", {})
        if self.return_type == "V1Pod":
            client = getattr(list_fn, "api_client", None)
            if client is None:
                raise TypeError("a pod list function without its api_client")
            # the client's own model building, item by item (its public deserialize takes text)
            listing["items"] = [client._ApiClient__deserialize(o, "V1Pod") for o in listing["items"]]
        return listing


def read_bounded(resp, limit_bytes: int, limit_items: int) -> bytes:
    """The body of `resp` (a urllib3 response, not read yet), refused past `limit_bytes`."""
    chunks, size = [], 0
    while chunk := resp.read(READ_CHUNK):
        size += len(chunk)
        if size > limit_bytes:
            raise ValueError(f"a list answer over {limit_bytes >> 20} MB for limit={limit_items}: the API server "
                             "ignores `limit` (refused, not parsed)")
        chunks.append(chunk)
    return b"".join(chunks)


async def stop_watchers(threads: list[_Watcher], timeout: float = JOIN_SECONDS) -> None:
    """Halt the watch threads and wait (at most `timeout` seconds in all) for them to end."""
    for t in threads:
        t.halt()

    def join() -> list[str]:
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in threads if t.is_alive()]

    left = await asyncio.to_thread(join)
    if left:
        log.debug("watch threads still in a request at exit: %s", ", ".join(left))


def _gone(ev: dict) -> bool:
    """An ERROR event whose Status is 410 Gone (the resourceVersion expired: relist)."""
    raw = ev.get("raw_object")
    return isinstance(raw, dict) and raw.get("code") == 410


def _rv(listing) -> str | None:
    meta = listing["metadata"] if isinstance(listing, dict) else listing.metadata
    return meta.get("resourceVersion") if isinstance(meta, dict) else meta.resource_version


def _rv_obj(obj) -> str | None:
    if isinstance(obj, dict):
        return obj.get("metadata", {}).get("resourceVersion")
    return obj.metadata.resource_version


def _items(listing) -> list:
    return listing["items"] if isinstance(listing, dict) else listing.items


class Discovery:
    """Process-0 pods in one namespace (optionally narrowed by a pod label selector).

    Only pods are read (the RBAC role grants get/list/watch on pods and get on pods/log):
    JobSets are known by their pods' jobset-name label."""

    def __init__(self, target: KubeTarget, selector: str | None = None, metrics=None,
                 page_size: int = PAGE_SIZE, recovery: Recovery | None = None) -> None:
        self.target, self.page_size, self.metrics = target, page_size, metrics
        # the health every source talking to the cluster shares (collector.notify.health):
        # a recovery wakes whoever waits on this discovery's changes (the followers' back-offs)
        self.recovery = recovery or Recovery()
        self.recovery.listeners.append(lambda: self._wake())
        self.selector = PROCESS0 + (f",{selector}" if selector else "")
        self.pods: dict[str, PodInfo] = {}  # uid -> pod
        self.changed = asyncio.Event()
        self.listed = False  # pods were listed at least once since start-up
        self.error: tuple[str, str, float] | None = None  # (kind, reason, when) of the last failure
        # the start of the latest span in which pods could not be seen (time ns; a failure before
        # the first list: from start-up): a pod may have lived and gone in it unseen
        self.blind_since_ns: int | None = None
        self._started_ns = time.time_ns()
        self.health = Health("discovery", metrics=metrics, recovery=self.recovery)
        self.server: str | None = None  # the API server's URL, once a client was built
        self.on_jobset = None  # called with each JobSet name seen for the first time
        self.on_failure = None  # called with (kind, reason) when listing/watching starts failing
        self.on_refused = None  # called with each Refusal the first time its key is seen
        self.refused: dict[str, str] = {}  # key -> reason, the first REFUSED_KEPT
        self.refused_count = 0  # distinct refused keys, all of them
        self._seen: set[str] = set()
        self._refused_seen: set[str] = set()  # beyond REFUSED_KEPT: keys only, to count each once
        self._threads: list[_Watcher] = []
        self._client = None

    def _connect(self):
        client = api_client(self.target)
        self.server = client.configuration.host
        return client

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._started_ns = time.time_ns()
        ns, selector = self.target.namespace, self.selector

        # Building a client runs the exec credential plugin (a subprocess, up to a second):
        # on the watch's thread, or every stream of every run would stall meanwhile.
        def connect():
            core = pods_api(self._connect())

            def list_pods(**kw):
                return core.list_namespaced_pod(ns, label_selector=selector, **kw)

            list_pods.api_client = core.api_client  # _Watcher._page builds the models
            return list_pods

        self._threads.append(_Watcher("discover-pods", loop, connect, self._pod_list, self._pod_event,
                                      self._error, self.page_size, recovery=self.recovery))
        for t in self._threads:
            t.start()

    async def close(self) -> None:
        """Halt the watch threads and wait for them to end (JOIN_SECONDS at most)."""
        await stop_watchers(self._threads)

    # -- called on the loop ------------------------------------------------------------------
    def _wake(self, changed=()) -> None:
        """Wake the followers; tell on_jobset of the JobSets of `changed` pods seen first
        (only those: a watch event in a namespace of 20,000 pods looks at one)."""
        self.changed.set()
        self.changed = asyncio.Event()
        for p in changed:
            if p.jobset and p.jobset not in self._seen:
                self._seen.add(p.jobset)
                if self.on_jobset:
                    self.on_jobset(p.jobset)

    def _refuse(self, r: Refusal) -> None:
        if r.key in self.refused or (self.refused_count >= REFUSED_KEPT and r.key in self._refused_seen):
            return
        self.refused_count += 1
        if self.metrics is not None:
            self.metrics.error("", "discovery", "refused_name")
        if len(self.refused) < REFUSED_KEPT:
            self.refused[r.key] = r.reason
        else:
            self._refused_seen.add(r.key)
        if self.refused_count <= REFUSED_LOGGED:
            log.error("pod discovery: refused %s, not followed: %s", r.key, r.reason)
            if self.refused_count == REFUSED_LOGGED:
                log.error("pod discovery: %d names refused; further ones are counted "
                          "(steptail_errors_total{source=\"discovery\",reason=\"refused_name\"}), not logged",
                          REFUSED_LOGGED)
        if self.on_refused is not None:
            self.on_refused(r)

    def _pod_list(self, items) -> None:
        pods = {}
        for p in items:
            if isinstance(p, Refusal):
                self._refuse(p)
            else:
                pods[p.uid] = p
        self.pods = pods
        self.listed, self.error = True, None
        self.health.ok()
        self._wake(pods.values())

    def _pod_event(self, typ: str, info) -> None:
        if isinstance(info, Refusal):  # a pod we followed may have become unsafe: no longer followed
            self._refuse(info)
            if self.pods.pop(info.uid, None) is not None:
                self._wake()
            return
        if typ == "DELETED":
            self.pods.pop(info.uid, None)
        else:
            self.pods[info.uid] = info
        self.error = None
        self.health.ok()
        self._wake([info])

    def _error(self, kind: str, reason: str) -> None:
        if self.error is None:  # a failure starts: pods come and go unseen from here (from start-up)
            self.blind_since_ns = time.time_ns() if self.listed else self._started_ns
        self.error = (kind, reason, time.time())
        if self.health.fail(kind, reason) and self.on_failure is not None:
            self.on_failure(kind, reason)
        self._wake()

    # -- queries -----------------------------------------------------------------------------
    def seen(self, jobset: str) -> bool:
        """A process-0 pod of `jobset` was listed or watched since start-up."""
        return jobset in self._seen

    def process0(self, jobset: str) -> list[PodInfo]:
        """Process-0 pods of one JobSet, oldest attempt first."""
        return sorted((p for p in self.pods.values() if p.jobset == jobset), key=lambda p: p.order)

    async def wait_change(self, timeout: float) -> None:
        changed = self.changed
        try:
            async with asyncio.timeout(timeout):  # not wait_for: on 3.11 it can swallow a cancel
                await changed.wait()
        except TimeoutError:
            pass

    def _core(self) -> PodsApi:
        """The client of single reads (on a worker thread), built at first use and again
        after a 401: credentials that failed come back."""
        if self._client is None:
            self._client = self._connect()
        return pods_api(self._client)

    def _forget_client_on_401(self, exc: Exception) -> None:
        if getattr(exc, "status", None) == 401:
            self._client = None

    async def get_pod(self, name: str) -> PodInfo | None:
        """A fresh read of one pod (None when it is gone); raises on API failure."""
        def get():
            try:
                return read_pod(self._core().read_namespaced_pod(name, self.target.namespace, _request_timeout=10))
            except ApiException as exc:
                if exc.status == 404:
                    return None
                self._forget_client_on_401(exc)
                raise

        info = await asyncio.to_thread(get)
        self.recovery.answered()  # the cluster answers: whoever waits out a failure retries now
        if isinstance(info, Refusal):  # became unsafe: as good as gone for its follower
            self._refuse(info)
            return None
        return info

    async def last_log_line(self, name: str, container: str) -> bytes:
        """The newest line of a pod's current log, with its kubelet timestamp (b"" when the
        current file is empty): one small non-follow read, to tell a hung stream from a
        quiet container. Raises on API failure."""
        def get() -> bytes:
            resp = self._core().read_namespaced_pod_log(name, self.target.namespace, container=container,
                                                        tail_lines=1, timestamps=True, _preload_content=False,
                                                        _request_timeout=10)
            try:
                return resp.data
            finally:
                resp.release_conn()

        data = await asyncio.to_thread(get)
        self.recovery.answered()  # the cluster answers: whoever waits out a failure retries now
        return data
