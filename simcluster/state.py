"""The cluster state: JobSets, pods, the watch event log, the resourceVersion counter and
the API faults, behind one re-entrant lock so a test's thread and the server's event loop
can both change it."""

from __future__ import annotations

import math
import random
import threading
import time
import uuid

from steptail.simcluster.faults import ApiFaults
from steptail.simcluster.logs import ContainerLog, Entry
from steptail.simcluster.objects import ContainerInstance, JobSetState, Pod
from steptail.simcluster.render import jobset_json, pod_json
from steptail.simcluster.scenario import JobSetSpec, Scenario
from steptail.simcluster.trainer import Trainer

# (resourceVersion, "pods" | "jobsets", ADDED | MODIFIED | DELETED, object as it was then)
Event = tuple[int, str, str, dict]


class ClusterState:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.lock = threading.RLock()
        self.rv = 1000
        self.events: list[Event] = []  # in rv order; watches replay from it
        self.pods: dict[tuple[str, str], Pod] = {}  # (namespace, name)
        self.jobsets: dict[tuple[str, str], JobSetState] = {}
        # per JobSet name: every LOSS-PARTS line process 0 wrote, for the ground truth
        self.truth_index: dict[str, list[tuple[tuple, Pod, ContainerInstance, Entry]]] = {}
        # per JobSet name: every line any process-0 container wrote, in write order (truth.py)
        self.journal: dict[str, list[tuple[ContainerLog, Entry]]] = {}
        self.faults = ApiFaults()
        self.applied: list = []  # truth.AppliedFault: the scenario's faults as they were applied
        self._rng = random.Random(scenario.seed)  # pod-name suffixes: same seed, same names

    # ---- lookups
    def jobset(self, name: str | None) -> JobSetState:
        """The JobSet called `name` (any namespace); None: the first one."""
        if name is None:
            return next(iter(self.jobsets.values()))
        for (_ns, n), js in self.jobsets.items():
            if n == name:
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
        else:
            objs = [jobset_json(j) for j in self.jobsets.values() if ns is None or j.spec.namespace == ns]
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

    def delete_expired_pods(self, now_ns: int) -> None:
        """Pods whose grace period (deletionTimestamp) has passed are gone: DELETED, then 404."""
        for p in list(self.pods.values()):
            if p.deletion_ns is not None and now_ns >= p.deletion_ns:
                del self.pods[(p.namespace, p.name)]
                for inst in p.instances:
                    inst.log.gone_ns = now_ns
                p.resource_version = self._bump()
                self._emit("pods", "DELETED", pod_json(p))

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
        """Create a JobSet and its pods, Pending for spec.pending_seconds."""
        tr = Trainer(**{"process_count": spec.slices * spec.hosts, **spec.trainer})
        js = JobSetState(
            spec=spec,
            uid=str(uuid.uuid4()),
            created_ns=time.time_ns(),
            trainer=tr,
            interval=1.0 / spec.rate if spec.rate > 0 else math.inf,
        )
        self.jobsets[(spec.namespace, spec.name)] = js
        self.truth_index.setdefault(spec.name, [])
        self.journal.setdefault(spec.name, [])
        self.jobset_event(js, "ADDED")
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
                )
                pod.instances.append(self.new_instance(pod, 0))
                self.pods[(pod.namespace, name)] = pod
                js.pods.append(name)
                self.pod_event(pod, "ADDED")
