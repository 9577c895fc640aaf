"""The JobSets of the namespace and their Kueue Workloads, listed and watched (read-only) for
the runbook's live checks (collector.live.runbook_live): what the rules read that a pod does
not carry (the queue label, spec.suspend, the pod templates, whether Kueue admitted it).

Same machinery as pod discovery (discovery._Watcher: one thread per resource, paged lists,
watches with a short server-side timeout, 401 re-runs the credential plugin). Both are
optional: a cluster without the Kueue CRD, or an RBAC role without these resources, costs
the rules that need them (one log line when it starts failing, one when it clears, a metric),
never the following of logs. Failing watches back off to FORBIDDEN_RETRY, not 0.5 s: a role
that lacks `jobsets` stays that way until someone changes it."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from kubernetes.client import CustomObjectsApi

from steptail.collector.cluster.discovery import PAGE_SIZE, _Watcher, stop_watchers
from steptail.collector.cluster.kubeclient import api_client
from steptail.collector.cluster.kubectl import KubeTarget
from steptail.collector.notify.health import Health, Recovery
from steptail.parsers.timestamps import parse_rfc3339

log = logging.getLogger("steptail.follow")
JOBSET_API = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
WORKLOAD_API = ("kueue.x-k8s.io", "v1beta1", "workloads")
OWN_FAILURES = ("forbidden", "not_found", "deserialize", "config")
FORBIDDEN_RETRY = 30.0  # seconds between tries of a list the API refuses or does not serve


def _ns(t) -> int | None:
    try:
        return parse_rfc3339(t) if isinstance(t, str) and t else None
    except ValueError:
        return None


@dataclass(frozen=True)
class WorkloadInfo:
    """What the rules need of a Kueue Workload: whose it is and whether it holds quota."""

    name: str
    jobset: str  # the owning JobSet's name ("" when it is not a JobSet's)
    active: bool  # spec.active (false: deactivated, Kueue evicts it)
    admitted: bool  # condition Admitted is True
    finished: bool  # condition Finished is True
    admitted_ns: int | None  # when Admitted last became True


def workload_info(obj) -> WorkloadInfo | None:
    if not isinstance(obj, dict):
        return None
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    owner = next((o for o in meta.get("ownerReferences") or []
                  if isinstance(o, dict) and o.get("kind") == "JobSet"), {})
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    conds = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, dict)}
    admitted = conds.get("Admitted", {})
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    return WorkloadInfo(
        name=str(meta.get("name") or ""), jobset=str(owner.get("name") or ""),
        active=spec.get("active") is not False,  # absent is active (Kueue's default)
        admitted=admitted.get("status") == "True", finished=conds.get("Finished", {}).get("status") == "True",
        admitted_ns=_ns(admitted.get("lastTransitionTime")) if admitted.get("status") == "True" else None)


def jobset_object(obj) -> dict | None:
    """The JobSet as the API sent it (a dict), or None for something that is not one."""
    if isinstance(obj, dict) and isinstance(obj.get("metadata"), dict) and obj["metadata"].get("name"):
        return obj
    return None


def jobset_failed(obj: dict) -> bool:
    """The JobSet controller gave up on it: terminalState Failed or a Failed condition."""
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    if status.get("terminalState") == "Failed":
        return True
    return any(isinstance(c, dict) and c.get("type") == "Failed" and c.get("status") == "True"
               for c in status.get("conditions") or [])


class ClusterObjects:
    """JobSets and Workloads of one namespace, kept current on the loop. `on_change(kind, name,
    deleted)` is called for every JobSet or Workload change (kind "jobset" or "workload")."""

    def __init__(self, target: KubeTarget, metrics=None, page_size: int = PAGE_SIZE,
                 recovery: Recovery | None = None) -> None:
        self.target, self.metrics, self.page_size = target, metrics, page_size
        self.recovery = recovery  # the cluster's shared health (pod discovery's)
        self.jobsets: dict[str, dict] = {}
        self.workloads: dict[str, WorkloadInfo] = {}  # by workload name
        self.listed = {"jobsets": False, "workloads": False}
        self.health = {kind: Health(kind, metrics=metrics, recovery=recovery) for kind in ("jobsets", "workloads")}
        self.outages: dict[str, int] = {}  # failures that are the API's, not this watch's (not logged)
        self.on_change = None
        self._threads: list[_Watcher] = []

    def workload_of(self, jobset: str) -> WorkloadInfo | None:
        for w in self.workloads.values():
            if w.jobset == jobset:
                return w
        return None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        ns = self.target.namespace

        def connect_to(group: str, version: str, plural: str):
            def connect():
                api = CustomObjectsApi(api_client(self.target))
                return lambda **kw: api.list_namespaced_custom_object(group, version, ns, plural, **kw)
            return connect

        for kind, (group, version, plural), read in (("jobsets", JOBSET_API, jobset_object),
                                                      ("workloads", WORKLOAD_API, workload_info)):
            self._threads.append(_Watcher(
                f"watch-{kind}", loop, connect_to(group, version, plural),
                lambda items, k=kind: self._listed(k, items), lambda typ, obj, k=kind: self._event(k, typ, obj),
                lambda err, reason, k=kind: self._error(k, err, reason), self.page_size, read=read,
                return_type="object", backoff_max=FORBIDDEN_RETRY, recovery=self.recovery))
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Halt the watch threads without waiting for them (close() waits)."""
        for t in self._threads:
            t.halt()

    async def close(self) -> None:
        """Halt the watch threads and wait for them to end (JOIN_SECONDS at most)."""
        await stop_watchers(self._threads)

    # -- on the loop ---------------------------------------------------------------------------
    def _store(self, kind: str) -> dict:
        return self.jobsets if kind == "jobsets" else self.workloads

    def _listed(self, kind: str, items: list) -> None:
        store = self._store(kind)
        before = dict(store)
        store.clear()
        for obj in items:
            if obj is not None:
                store[self._key(kind, obj)] = obj
        self.listed[kind] = True
        self.health[kind].ok()
        for name, obj in before.items():
            if name not in store:
                self._tell(kind, obj, True)
        for obj in store.values():
            self._tell(kind, obj, False)

    def _event(self, kind: str, typ: str, obj) -> None:
        self.health[kind].ok()
        if obj is None or typ == "BOOKMARK":
            return
        store = self._store(kind)
        if typ == "DELETED":
            store.pop(self._key(kind, obj), None)
        else:
            store[self._key(kind, obj)] = obj
        self._tell(kind, obj, typ == "DELETED")

    @staticmethod
    def _key(kind: str, obj) -> str:
        return obj["metadata"]["name"] if kind == "jobsets" else obj.name

    def _tell(self, kind: str, obj, deleted: bool) -> None:
        """on_change with the JobSet's name (a Workload's owner)."""
        if self.on_change is not None:
            name = obj["metadata"]["name"] if kind == "jobsets" else obj.jobset
            if name:
                self.on_change(kind, name, deleted)

    def _error(self, kind: str, err: str, reason: str) -> None:
        """What is this watch's own (the role lacks the resource, the CRD is not installed, an
        object it cannot read): one log line when it starts and clears. An outage of the API
        or of the credentials is pod discovery's to say (the same cause, said once): counted
        here, logged at debug."""
        if err in OWN_FAILURES:
            self.health[kind].fail(err, f"{kind}: {reason}")
            return
        self.outages[kind] = self.outages.get(kind, 0) + 1
        if self.metrics is not None:
            self.metrics.error("", kind, err)
        log.debug("%s watch: %s: %s", kind, err, reason)
