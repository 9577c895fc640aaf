"""The cluster state: JobSets, their Kueue Workloads, pods, the watch event log, the
resourceVersion counter and the API faults, behind one re-entrant lock so a test's thread and
the server's event loop can both change it."""

from __future__ import annotations

import copy
import math
import random
import threading
import time
import uuid

from steptail.simcluster.faults import ApiFaults
from steptail.simcluster.logs import ContainerLog, Entry
from steptail.simcluster.objects import ContainerInstance, JobSetState, Pod, Workload
from steptail.simcluster.render import (
    jobset_json,
    pod_json,
    pod_sets,
    pod_template,
    workload_json,
    workload_name,
)
from steptail.simcluster.scenario import JobSetSpec, Scenario
from steptail.simcluster.trainer import Trainer

# (resourceVersion, "pods" | "jobsets" | "workloads", ADDED | MODIFIED | DELETED, object as it was then)
Event = tuple[int, str, str, dict]


class ClusterState:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.lock = threading.RLock()
        self.rv = 1000
        self.events: list[Event] = []  # in rv order; watches replay from it
        self.pods: dict[tuple[str, str], Pod] = {}  # (namespace, name)
        self.jobsets: dict[tuple[str, str], JobSetState] = {}
        # JobSets deleted (fail_jobset's reap), kept for the ground truth of what they wrote
        self.deleted: dict[tuple[str, str], JobSetState] = {}
        # per JobSet name: every LOSS-PARTS line process 0 wrote, for the ground truth
        self.truth_index: dict[str, list[tuple[tuple, Pod, ContainerInstance, Entry]]] = {}
        # per JobSet name: every line any process-0 container wrote, in write order (truth.py)
        self.journal: dict[str, list[tuple[ContainerLog, Entry]]] = {}
        self.faults = ApiFaults()
        self.applied: list = []  # truth.AppliedFault: the scenario's faults as they were applied
        self._rng = random.Random(scenario.seed)  # pod-name suffixes: same seed, same names

    # ---- lookups
    def jobset(self, name: str | None) -> JobSetState:
        """The JobSet called `name` (any namespace); None: the first one. A deleted one is
        found when no live one has the name (its truth stays readable; it changes no more)."""
        for table in (self.jobsets, self.deleted):
            for (_ns, n), js in table.items():
                if name is None or n == name:
                    return js
        raise KeyError(f"no JobSet {name!r}")

    def jobset_pods(self, js: JobSetState) -> list[Pod]:
        return [p for n in js.pods if (p := self.pods.get((js.spec.namespace, n)))]

    def process0(self, js: JobSetState) -> Pod | None:
        for p in self.jobset_pods(js):
            if p.process_index == 0:
                return p
        return None

    def namespaces(self) -> list[str]:
        return sorted({"default", "kube-system", self.scenario.namespace} | {ns for ns, _ in self.jobsets})

    def snapshot(self, kind: str, ns: str | None) -> list[dict]:
        """JSON of every pod or JobSet (of `ns`, None: all), sorted like the apiserver."""
        if kind == "pods":
            objs = [pod_json(p) for p in self.pods.values() if ns is None or p.namespace == ns]
        elif kind == "jobsets":
            objs = [jobset_json(j) for j in self.jobsets.values() if ns is None or j.spec.namespace == ns]
        else:
            objs = [workload_json(j) for j in self.jobsets.values()
                    if j.workload is not None and (ns is None or j.spec.namespace == ns)]
        return sorted(objs, key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]))

    # ---- changes (each bumps the resourceVersion and logs a watch event)
    def _bump(self) -> int:
        self.rv += 1
        return self.rv

    def _emit(self, kind: str, typ: str, obj: dict) -> None:
        self.events.append((int(obj["metadata"]["resourceVersion"]), kind, typ, obj))

    def pod_event(self, pod: Pod, typ: str) -> None:
        pod.resource_version = self._bump()
        self._emit("pods", typ, pod_json(pod))

    def jobset_event(self, js: JobSetState, typ: str) -> None:
        js.resource_version = self._bump()
        self._emit("jobsets", typ, jobset_json(js))

    def workload_event(self, js: JobSetState, typ: str) -> None:
        if js.workload is not None:
            js.workload.resource_version = self._bump()
            self._emit("workloads", typ, workload_json(js))

    def delete_expired_pods(self, now_ns: int) -> None:
        """Pods whose grace period (deletionTimestamp) has passed are gone: DELETED, then 404."""
        for p in list(self.pods.values()):
            if p.deletion_ns is not None and now_ns >= p.deletion_ns:
                self._pod_gone(p, now_ns)

    def _pod_gone(self, p: Pod, now_ns: int) -> None:
        del self.pods[(p.namespace, p.name)]
        for inst in p.instances:
            inst.log.gone_ns = now_ns
        p.resource_version = self._bump()
        self._emit("pods", "DELETED", pod_json(p))

    def delete_jobset(self, js: JobSetState) -> None:
        """The JobSet is deleted (background propagation): DELETED, then the garbage collector
        deletes its Workload (deletionTimestamp, then DELETED once Kueue drops its finalizer)
        and its pods (DELETED at once: a pod in a terminal phase has no grace period); their
        logs go with them. A running pod is deleted gracefully (grace_seconds) instead."""
        key = (js.spec.namespace, js.spec.name)
        now = time.time_ns()
        self.jobsets.pop(key, None)
        js.deleted = True
        js.reap_at = None
        self.deleted[key] = js
        self.jobset_event(js, "DELETED")
        if js.workload is not None:
            js.workload.deletion_ns = now
            self.workload_event(js, "MODIFIED")
            self.workload_event(js, "DELETED")
        for p in self.jobset_pods(js):
            if p.phase in ("Failed", "Succeeded") or p.current.state == "waiting":
                self._pod_gone(p, now)
            elif p.deletion_ns is None:
                inst = p.current
                inst.state, inst.reason, inst.finished_ns, inst.exit_code = "terminated", "Error", now, 137
                inst.log.terminated = True
                p.phase = "Failed"
                p.deletion_ns = now + int(self.scenario.grace_seconds * 1e9)
                p.grace_seconds = int(math.ceil(self.scenario.grace_seconds))
                self.pod_event(p, "MODIFIED")

    def new_log(self) -> ContainerLog:
        return ContainerLog(self.scenario.log_max_size, self.scenario.log_max_files)

    def new_instance(self, pod: Pod, restart_count: int, **kw) -> ContainerInstance:
        """A container instance of `pod` with a fresh log on the pod's node clock; process 0's
        lines also go to the JobSet's journal (the truth of every line written)."""
        log = self.new_log()
        log.clock_offset_ns = pod.clock_offset_ns
        inst = ContainerInstance(restart_count, log, **kw)
        if pod.process_index == 0:
            log.journal = self.journal.setdefault(pod.jobset, [])
            log.owner = (pod, inst)
        return inst

    def add_jobset(self, spec: JobSetSpec) -> JobSetState:
        """Create a JobSet and, with a queue label, its Kueue Workload. Admitted at once (pods
        created, Pending for spec.pending_seconds) unless spec.queued_seconds: then suspended
        by Kueue, without pods, until the controller admits it."""
        key = (spec.namespace, spec.name)
        if key in self.jobsets:
            raise ValueError(f"JobSet {spec.namespace}/{spec.name} already exists")
        tr = Trainer(**{"process_count": spec.slices * spec.hosts, **spec.trainer})
        now = time.time_ns()
        js = JobSetState(
            spec=spec,
            uid=str(uuid.uuid4()),
            created_ns=now,
            trainer=tr,
            interval=1.0 / spec.rate if spec.rate > 0 else math.inf,
            image=spec.image,
            suspend=spec.suspend,
        )
        if spec.queue:  # Kueue manages only JobSets with a queue-name label
            js.workload = Workload(name=workload_name(spec.name, js.uid), uid=str(uuid.uuid4()), created_ns=now,
                                   queue=spec.queue, cluster_queue=f"{spec.queue}-cq", pod_sets=pod_sets(js))
        queued = js.workload is not None and spec.queued_seconds > 0
        if queued:
            js.state = "queued"
            js.queued_until = time.monotonic() + spec.queued_seconds
        else:
            js.resumed_ns = now
            if js.workload is not None:
                js.workload.admitted_ns = now
        self.deleted.pop(key, None)
        self.jobsets[key] = js
        self.truth_index.setdefault(spec.name, [])
        self.journal.setdefault(spec.name, [])
        self.jobset_event(js, "ADDED")
        self.workload_event(js, "ADDED")
        if not queued:
            self.create_pods(js, spec.pending_seconds)
        return js

    def _suffix(self) -> str:
        return "".join(self._rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))

    def create_pods(self, js: JobSetState, pending_seconds: float) -> None:
        """A fresh set of pods for `js` (at creation or after a JobSet restart), labelled like
        GKE's JobSet controller labels them."""
        spec = js.spec
        js.pods = []
        js.state = "pending"
        js.pending_until = time.monotonic() + pending_seconds
        now = time.time_ns()
        template = copy.deepcopy(pod_template(js))  # the image etc. these pods keep
        for ji in range(spec.slices):
            job_name = f"{spec.name}-{spec.replicated_job}-{ji}"
            for ci in range(spec.hosts):
                gi = ji * spec.hosts + ci
                name = f"{job_name}-{ci}-{self._suffix()}"
                labels = {
                    "jobset.sigs.k8s.io/jobset-name": spec.name,
                    "jobset.sigs.k8s.io/replicatedjob-name": spec.replicated_job,
                    "jobset.sigs.k8s.io/job-index": str(ji),
                    "jobset.sigs.k8s.io/job-global-index": str(ji),
                    "jobset.sigs.k8s.io/restart-attempt": str(js.restart_attempt),
                    "jobset.sigs.k8s.io/replicatedjob-replicas": str(spec.slices),
                    "batch.kubernetes.io/job-completion-index": str(ci),
                    "batch.kubernetes.io/job-name": job_name,
                    "job-name": job_name,
                    "batch.kubernetes.io/controller-uid": str(uuid.UUID(int=self._rng.getrandbits(128))),
                }
                pod = Pod(
                    name=name,
                    namespace=spec.namespace,
                    uid=str(uuid.uuid4()),
                    labels=labels,
                    jobset=spec.name,
                    job_name=job_name,
                    created_ns=now,
                    node=f"gke-tpu-{spec.name[:12]}-{gi:02d}-{self._suffix()}",
                    process_index=gi,
                    template=template,
                )
                pod.instances.append(self.new_instance(pod, 0))
                self.pods[(pod.namespace, name)] = pod
                js.pods.append(name)
                self.pod_event(pod, "ADDED")
