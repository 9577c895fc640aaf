"""`steptail archive`: the pods of a JobSet, listed once with the `kubernetes` client (every
replicated job, job index and restart attempt still present), and the container logs each one
has to give: the current container's, and `--previous` after a restart."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from steptail.collector.cluster.discovery import ATTEMPT, JOBSET, reason_of
from steptail.collector.cluster.kubeclient import api_client
from steptail.collector.cluster.kubectl import KubeTarget
from steptail.collector.cluster.pods_api import pods_api
from steptail.runs.names import RunNameError, check_cluster_name

JOB_INDEX = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
LIST_TIMEOUT = 30.0


class ListError(Exception):
    """The pods could not be listed (kind: auth, forbidden, network, …); one line."""

    def __init__(self, kind: str, reason: str) -> None:
        self.kind = kind
        super().__init__(reason)


@dataclass(frozen=True)
class ContainerInfo:
    name: str
    restart_count: int
    state: str  # waiting | running | terminated
    reason: str


@dataclass(frozen=True)
class PodRecord:
    name: str
    uid: str
    node: str | None
    phase: str
    replicated_job: str | None
    job_index: int | None
    completion_index: int | None
    restart_attempt: int | None
    created: str | None
    deletion_timestamp: str | None
    containers: tuple[ContainerInfo, ...]  # spec order: the first is the one follow reads

    @property
    def process0(self) -> bool:
        return self.job_index == 0 and self.completion_index == 0

    def manifest(self) -> dict:
        return {**asdict(self), "containers": [asdict(c) for c in self.containers]}

    @classmethod
    def from_manifest(cls, d: dict) -> PodRecord:
        return cls(**{**d, "containers": tuple(ContainerInfo(**c) for c in d.get("containers", ()))})


@dataclass(frozen=True)
class LogTask:
    """One container instance's log to read."""

    pod: PodRecord
    container: str
    previous: bool
    restart_count: int  # of that instance: the stream key follow gives it
    final: bool  # the instance had terminated when listed: its log cannot grow

    @property
    def path(self) -> str:
        """Relative to the JobSet's archive folder."""
        return f"{self.pod.name}/{self.container}{'.previous' if self.previous else ''}.log.gz"

    @property
    def stream_key(self) -> str:
        return f"{self.pod.uid}/{self.container}/{self.restart_count}"


def _int(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def pod_record(obj: dict) -> PodRecord:
    """From the pod's JSON (raw, not the client's models: a pod they cannot read is still archived)."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    labels = meta.get("labels") or {}
    statuses = {c.get("name"): c for c in status.get("containerStatuses") or []}
    containers = []
    for c in spec.get("containers") or []:
        cs = statuses.get(c.get("name")) or {}
        state = cs.get("state") or {}
        kind = next((k for k in ("running", "terminated", "waiting") if k in state), "waiting")
        reason = (state.get(kind) or {}).get("reason") or ("" if kind == "running" else "Pending")
        containers.append(ContainerInfo(c.get("name", ""), int(cs.get("restartCount") or 0), kind, reason))
    return PodRecord(
        name=meta.get("name", ""), uid=meta.get("uid", ""), node=spec.get("nodeName"),
        phase=status.get("phase") or "", replicated_job=labels.get(REPLICATED_JOB),
        job_index=_int(labels.get(JOB_INDEX)), completion_index=_int(labels.get(COMPLETION_INDEX)),
        restart_attempt=_int(labels.get(ATTEMPT)), created=meta.get("creationTimestamp"),
        deletion_timestamp=meta.get("deletionTimestamp"), containers=tuple(containers),
    )


def list_pods(target: KubeTarget, jobset: str) -> list[PodRecord]:
    """Every pod labelled with the JobSet's name (blocking; raises ListError)."""
    try:
        client = api_client(target)
        try:
            resp = pods_api(client).list_namespaced_pod(
                target.namespace, label_selector=f"{JOBSET}={jobset}", _preload_content=False,
                _request_timeout=LIST_TIMEOUT)
            items = json.loads(resp.data).get("items") or []
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - every failure of the one list is one line
        kind, reason = reason_of(exc)
        raise ListError(kind, f"cannot list the pods of JobSet {jobset} in namespace {target.namespace}: "
                              f"{reason}") from None
    return sorted((pod_record(o) for o in items), key=lambda p: (p.restart_attempt or 0, p.name))


def unsafe(pod: PodRecord) -> str | None:
    """Why a listed pod cannot be archived: a name (pod, uid, container) that would name files
    is not a safe identifier (runs.names). None when it is fine."""
    try:
        check_cluster_name("pod", pod.name)
        check_cluster_name("uid", pod.uid)
        for c in pod.containers:
            check_cluster_name("container", c.name)
    except RunNameError as exc:
        return str(exc)
    return None


def log_tasks(pod: PodRecord) -> list[LogTask]:
    """The container instances of `pod` that have a log: the previous one after a restart
    (terminated: final), the current one once it started (final when it terminated)."""
    tasks = []
    for c in pod.containers:
        if c.restart_count > 0:
            tasks.append(LogTask(pod, c.name, True, c.restart_count - 1, True))
        if c.state != "waiting":
            tasks.append(LogTask(pod, c.name, False, c.restart_count, c.state == "terminated"))
    return tasks
