"""Finding JAX process 0 of each JobSet: list + watch of pods (and of JobSets for `--all`)
with the `kubernetes` client, on daemon threads, handing snapshots to the event loop.

The client is blocking; each watch runs on its own thread with a short server-side timeout
so it notices `stop()` within seconds. Every change wakes the followers (`changed`)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from dataclasses import dataclass

# Named imports, at import time: the client loads its API and model modules lazily, on
# first attribute access, and that takes about half a second (pydantic models) which inside
# the event loop would stall every stream.
from kubernetes import config, watch
from kubernetes.client import ApiClient, Configuration, CoreV1Api, V1Pod  # noqa: F401 - V1Pod: the watch's type
from kubernetes.client.exceptions import ApiException

from collector.kubectl import ACCOUNT_VAR, KubeTarget, classify

JOBSET = "jobset.sigs.k8s.io/jobset-name"
ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
PROCESS0 = "jobset.sigs.k8s.io/job-index=0,batch.kubernetes.io/job-completion-index=0"
WATCH_SECONDS = 5


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

    @property
    def order(self) -> tuple:
        return (self.attempt, self.created, self.name)


def _ns(t) -> int | None:
    if t is None:
        return None
    if isinstance(t, str):
        from collector.sim.kube import parse_rfc3339_ns  # pure helper, no sim state

        return parse_rfc3339_ns(t)
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
    try:
        attempt = int(labels.get(ATTEMPT, "0"))
    except ValueError:
        attempt = 0
    return PodInfo(
        name=meta.name, uid=meta.uid, jobset=labels.get(JOBSET, ""), attempt=attempt,
        created=str(meta.creation_timestamp), phase=(status.phase if status else "") or "",
        deleting=meta.deletion_timestamp is not None, container=container, restart_count=rc,
        state=state, reason=reason, finished_ns=finished, started_ns=started,
        previous_finished_ns=prev_finished,
    )


def api_client(target: KubeTarget):
    """A kubernetes ApiClient for the target (the exec auth plugin sees the account)."""
    os.environ[ACCOUNT_VAR] = target.account  # the client's exec provider copies os.environ
    in_cluster = not target.kubeconfig and not os.environ.get("KUBECONFIG") \
        and not os.path.exists(os.path.expanduser("~/.kube/config")) and os.environ.get("KUBERNETES_SERVICE_HOST")
    if in_cluster:  # a pod with a ServiceAccount (deploy/): the token kubectl uses too
        cfg = Configuration()
        config.load_incluster_config(client_configuration=cfg)
        return ApiClient(cfg)
    return config.new_client_from_config(config_file=target.kubeconfig, context=target.context)


class _ExecPluginErrors(logging.Filter):
    """The kubernetes client logs an exec auth plugin failure on the root logger (with the
    plugin's stderr) and then sends no credentials: keep that text as the reason of the 401
    instead of printing it."""

    def __init__(self) -> None:
        super().__init__()
        self.last: tuple[float, str] | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if msg.startswith("exec: process returned"):
            self.last = (time.monotonic(), classify(msg)[1])
            return False
        return True


EXEC_ERRORS = _ExecPluginErrors()
logging.getLogger().addFilter(EXEC_ERRORS)


def reason_of(exc: Exception) -> tuple[str, str]:
    status = getattr(exc, "status", None)
    if status in (401, 403):
        last = EXEC_ERRORS.last
        if last is not None and time.monotonic() - last[0] < 30:
            return "auth", f"{last[1]} (Kubernetes API answered {status})"
        return "auth", f"Kubernetes API answered {status} {getattr(exc, 'reason', '')}".strip()
    if isinstance(status, int) and status >= 500:
        return "server_error", f"Kubernetes API answered {status}"
    return classify(str(exc))


class _Watcher(threading.Thread):
    """list + watch one resource on a thread; `apply(kind, items|event)` runs on the loop."""

    def __init__(self, name: str, loop: asyncio.AbstractEventLoop, list_fn, on_list, on_event, on_error):
        super().__init__(name=name, daemon=True)
        self.loop, self.list_fn = loop, list_fn
        self.on_list, self.on_event, self.on_error = on_list, on_event, on_error
        self.stopping = threading.Event()

    def _post(self, fn, *args) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # loop closed: we are shutting down
            self.stopping.set()

    def run(self) -> None:
        backoff = 0.2
        while not self.stopping.is_set():
            try:
                listing = self.list_fn(_request_timeout=15)
                rv = _rv(listing)
                self._post(self.on_list, _items(listing))
                backoff = 0.2
                while not self.stopping.is_set():
                    w = watch.Watch(return_type="V1Pod")
                    for ev in w.stream(self.list_fn, resource_version=rv, timeout_seconds=WATCH_SECONDS,
                                       _request_timeout=WATCH_SECONDS + 10):
                        if self.stopping.is_set():
                            w.stop()
                            break
                        if ev["type"] == "ERROR":
                            raise RuntimeError(f"watch error: {ev.get('raw_object')}")
                        rv = _rv_obj(ev["object"]) or rv
                        self._post(self.on_event, ev["type"], ev["object"])
            except Exception as exc:  # noqa: BLE001 - any failure: report, back off, re-list
                if self.stopping.is_set():
                    break
                self._post(self.on_error, *reason_of(exc))
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)


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

    def __init__(self, target: KubeTarget, selector: str | None = None) -> None:
        self.target = target
        self.selector = PROCESS0 + (f",{selector}" if selector else "")
        self.pods: dict[str, PodInfo] = {}  # uid -> pod
        self.changed = asyncio.Event()
        self.listed = False
        self.error: tuple[str, str, float] | None = None  # (kind, reason, when) of the last failure
        self.on_jobset = None  # called with each JobSet name seen for the first time
        self._seen: set[str] = set()
        self._threads: list[_Watcher] = []
        self._client = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        # Building a client runs the exec credential plugin (a subprocess, up to a second):
        # on a thread, or every stream of every run would stall meanwhile. The watch keeps a
        # client of its own, as before.
        self._client, watch_client = await asyncio.to_thread(
            lambda: (api_client(self.target), api_client(self.target)))
        core = CoreV1Api(watch_client)
        ns, selector = self.target.namespace, self.selector

        def list_pods(**kw):
            return core.list_namespaced_pod(ns, label_selector=selector, **kw)

        self._threads.append(_Watcher("discover-pods", loop, list_pods, self._pod_list, self._pod_event,
                                      self._error))
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        for t in self._threads:
            t.stopping.set()

    # -- called on the loop ------------------------------------------------------------------
    def _wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()
        for p in self.pods.values():
            if p.jobset and p.jobset not in self._seen:
                self._seen.add(p.jobset)
                if self.on_jobset:
                    self.on_jobset(p.jobset)

    def _pod_list(self, items) -> None:
        self.pods = {p.uid: p for p in map(pod_info, items)}
        self.listed, self.error = True, None
        self._wake()

    def _pod_event(self, typ: str, obj) -> None:
        info = pod_info(obj)
        if typ == "DELETED":
            self.pods.pop(info.uid, None)
        else:
            self.pods[info.uid] = info
        self.error = None
        self._wake()

    def _error(self, kind: str, reason: str) -> None:
        self.error = (kind, reason, time.time())
        self._wake()

    # -- queries -----------------------------------------------------------------------------
    def process0(self, jobset: str) -> list[PodInfo]:
        """Process-0 pods of one JobSet, oldest attempt first."""
        return sorted((p for p in self.pods.values() if p.jobset == jobset), key=lambda p: p.order)

    async def wait_change(self, timeout: float) -> None:
        changed = self.changed
        try:
            await asyncio.wait_for(changed.wait(), timeout)
        except TimeoutError:
            pass

    async def get_pod(self, name: str) -> PodInfo | None:
        """A fresh read of one pod (None when it is gone); raises on API failure."""
        core = CoreV1Api(self._client)

        def get():
            try:
                return pod_info(core.read_namespaced_pod(name, self.target.namespace, _request_timeout=10))
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise

        return await asyncio.to_thread(get)

    async def last_log_line(self, name: str, container: str) -> bytes:
        """The newest line of a pod's current log, with its kubelet timestamp (b"" when the
        current file is empty): one small non-follow read, to tell a hung stream from a
        quiet container. Raises on API failure."""
        core = CoreV1Api(self._client)

        def get() -> bytes:
            resp = core.read_namespaced_pod_log(name, self.target.namespace, container=container,
                                                tail_lines=1, timestamps=True, _preload_content=False,
                                                _request_timeout=10)
            try:
                return resp.data
            finally:
                resp.release_conn()

        return await asyncio.to_thread(get)
