"""The Kubernetes JSON of the simulated objects, as the API serves them and watch events
carry them, and the Table form kubectl's printer asks for (`Accept: …as=Table…`): pods,
JobSets (jobset.x-k8s.io/v1alpha2) and their Kueue Workloads (kueue.x-k8s.io/v1beta1)."""

from __future__ import annotations

import copy
import hashlib
import time
import uuid
from typing import Any

from steptail.simcluster import kube
from steptail.simcluster.objects import CONTAINER, JobSetState, Pod, Workload

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
WORKLOAD_API = "kueue.x-k8s.io/v1beta1"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
TPU_RESOURCE = "google.com/tpu"
CHIPS_PER_HOST = 4  # google.com/tpu of each v5p host
COMMAND = ["python3", "-m", "maxtext.trainers.post_train.sft.train_sft"]
CONFIG = "maxtext/configs/post_train/sft.yml"
# JobSet controller condition reasons and messages (sigs.k8s.io/jobset pkg/constants)
COMPLETED = ("Completed", "AllJobsCompleted", "jobset completed successfully")
FAILED = ("Failed", "FailedJobs", "jobset failed due to one or more job failures")
SUSPENDED = ("Suspended", "SuspendedJobs", "jobset is suspended")
RESUMED = ("Suspended", "ResumeJobs", "jobset is resumed")


def _ts(ns: int | None) -> str | None:
    return kube.rfc3339(ns) if ns else None


def image_id(image: str) -> str:
    """What the kubelet reports as a container's imageID: `<repository>@sha256:<digest>`; the
    simulated digest is a function of the image reference, so one image keeps one ID."""
    repo, _, digest = image.partition("@")
    head, _, last = repo.rpartition("/")
    name = last.partition(":")[0]
    repo = f"{head}/{name}" if head else name
    if digest.startswith("sha256:"):
        return f"{repo}@{digest}"
    return f"{repo}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


def trainer_args(js: JobSetState) -> list[str]:
    """The MaxText config and `key=value` overrides of the trainer container, from the
    trainer's own settings (what its start-up lines print), then the scenario's `args`."""
    spec, tr = js.spec, js.trainer
    return [
        CONFIG,
        f"run_name={tr.run_name}",
        f"steps={tr.steps}",
        f"checkpoint_period={tr.checkpoint_period}",
        f"ici_context_parallelism={tr.context_parallelism}",
        f"context_parallel_load_balance={bool(tr.load_balance)}",
        *spec.args,
    ]


def _volume(v: dict) -> dict:
    opts = [*v["mount_options"], *([f"only-dir={v['only_dir']}"] if v["only_dir"] else [])]
    attrs = {"bucketName": v["bucket"]}
    if opts:
        attrs["mountOptions"] = ",".join(opts)
    return {"name": v["name"], "csi": {"driver": GCSFUSE_DRIVER, "readOnly": v["read_only"],
                                       "volumeAttributes": attrs}}


def node_selector(js: JobSetState) -> dict:
    spec = js.spec
    sel = {}
    if spec.accelerator:
        sel["cloud.google.com/gke-tpu-accelerator"] = spec.accelerator
    if spec.topology:
        sel["cloud.google.com/gke-tpu-topology"] = spec.topology
    return sel


def pod_template(js: JobSetState) -> dict:
    """The pod template of the JobSet's replicated job, as it is now (its image follows
    set_image); each pod keeps a copy of the one it was created from."""
    spec = js.spec
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": js.image or spec.image,
        "command": list(COMMAND),
        "args": trainer_args(js),
        "resources": {"limits": {TPU_RESOURCE: str(CHIPS_PER_HOST)}},
    }
    if spec.volumes:
        container["volumeMounts"] = [{"name": v["name"], "mountPath": v["mount_path"], "readOnly": v["read_only"]}
                                     for v in spec.volumes]
    pspec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "nodeSelector": node_selector(js),
        "containers": [container],
    }
    if spec.volumes:
        pspec["volumes"] = [_volume(v) for v in spec.volumes]
    meta: dict[str, Any] = {}
    if spec.volumes:
        meta["annotations"] = {"gke-gcsfuse/volumes": "true"}  # the GKE gcsfuse CSI driver's opt-in
    return {"metadata": meta, "spec": pspec}


def pod_json(p: Pod) -> dict:
    inst = p.current
    tmpl = p.template or {"metadata": {}, "spec": {"containers": [{"name": CONTAINER, "image": ""}]}}
    container = next((c for c in tmpl["spec"]["containers"] if c["name"] == CONTAINER), tmpl["spec"]["containers"][0])
    image = container["image"]
    prev_started = p.previous is not None
    state: dict[str, Any]
    if inst.state == "running":
        state = {"running": {"startedAt": _ts(inst.started_ns)}}
    elif inst.state == "terminated":
        state = {"terminated": {"exitCode": inst.exit_code, "reason": inst.reason,
                                "startedAt": _ts(inst.started_ns), "finishedAt": _ts(inst.finished_ns),
                                "containerID": inst.container_id}}
    else:
        state = {"waiting": {"reason": inst.reason}}
    cs = {
        "name": CONTAINER,
        "state": state,
        "lastState": {},
        "ready": inst.state == "running" and p.deletion_ns is None,
        "restartCount": inst.restart_count,
        "image": image,
        # the kubelet knows the image's digest once it pulled it (the container ran)
        "imageID": image_id(image) if inst.state != "waiting" or prev_started else "",
        "started": inst.state == "running",
    }
    if inst.state != "waiting":
        cs["containerID"] = inst.container_id
    prev = p.previous
    if prev is not None:
        cs["lastState"] = {"terminated": {"exitCode": prev.exit_code, "reason": prev.reason,
                                          "startedAt": _ts(prev.started_ns),
                                          "finishedAt": _ts(prev.finished_ns),
                                          "containerID": prev.container_id}}
    ready = "True" if cs["ready"] else "False"
    meta: dict[str, Any] = {
        "name": p.name,
        "generateName": p.name[:-5],
        "namespace": p.namespace,
        "uid": p.uid,
        "resourceVersion": str(p.resource_version),
        "creationTimestamp": _ts(p.created_ns),
        "labels": dict(p.labels),
        "annotations": {
            **(tmpl["metadata"].get("annotations") or {}),
            "jobset.sigs.k8s.io/jobset-name": p.jobset,
            "batch.kubernetes.io/job-completion-index": p.labels["batch.kubernetes.io/job-completion-index"],
        },
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": p.job_name,
                             "uid": p.labels["batch.kubernetes.io/controller-uid"],
                             "controller": True, "blockOwnerDeletion": True}],
    }
    if p.deletion_ns is not None:
        meta["deletionTimestamp"] = _ts(p.deletion_ns)
        meta["deletionGracePeriodSeconds"] = p.grace_seconds
    status: dict[str, Any] = {
        "phase": p.phase,
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": _ts(p.created_ns)},
            {"type": "Initialized", "status": "True", "lastTransitionTime": _ts(p.created_ns)},
            {"type": "ContainersReady", "status": ready, "lastTransitionTime": _ts(p.start_ns or p.created_ns)},
            {"type": "Ready", "status": ready, "lastTransitionTime": _ts(p.start_ns or p.created_ns)},
        ],
        "hostIP": f"10.0.{p.process_index // 250}.{p.process_index % 250 + 2}",
        "podIP": f"10.8.{p.process_index // 250}.{p.process_index % 250 + 2}",
        "qosClass": "Guaranteed",
        "containerStatuses": [cs],
    }
    if p.start_ns:
        status["startTime"] = _ts(p.start_ns)
    spec = copy.deepcopy(tmpl["spec"])
    for c in spec["containers"]:  # the apiserver defaults requests to limits and the pull policy
        res = c.setdefault("resources", {})
        if "limits" in res and "requests" not in res:
            res["requests"] = dict(res["limits"])
        c.setdefault("imagePullPolicy", "Always" if c["image"].endswith(":latest") else "IfNotPresent")
    spec.update({"nodeName": p.node, "subdomain": p.jobset, "hostname": p.name[:-6],
                 "schedulerName": "default-scheduler"})
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": meta,
        "spec": spec,
        "status": status,
    }


def _condition(kind: tuple[str, str, str], status: bool, at_ns: int | None) -> dict:
    typ, reason, message = kind
    return {"type": typ, "status": "True" if status else "False", "lastTransitionTime": _ts(at_ns),
            "reason": reason, "message": message}


def jobset_json(js: JobSetState) -> dict:
    return _omitted(_jobset_json(js), js.spec.omit)


def _omitted(obj: dict, omit: list[str]) -> dict:
    """The JobSet without the optional fields its spec says it lacks (scenario `omit`)."""
    if not omit:
        return obj
    tmpl = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    container = tmpl["spec"]["containers"][0]
    for name in omit:
        if name == "status":
            obj.pop("status", None)
        elif name == "annotations":
            obj["metadata"].pop(name, None)
            tmpl["metadata"].pop(name, None)
        elif name in ("nodeSelector", "volumes"):
            tmpl["spec"].pop(name, None)
            if name == "volumes":
                container.pop("volumeMounts", None)
        else:  # image, args, resources: the container's
            container.pop(name, None)
    return obj


def _jobset_json(js: JobSetState) -> dict:
    spec = js.spec
    labels = {QUEUE_LABEL: spec.queue} if spec.queue else {}
    conditions = []
    if js.workload is not None:  # Kueue's webhook created it suspended; admission resumed it
        if js.resumed_ns is None:
            conditions.append(_condition(SUSPENDED, True, js.created_ns))
        else:
            conditions.append(_condition(RESUMED, False, js.resumed_ns))
    if js.state == "done":
        conditions.append(_condition(COMPLETED, True, js.finished_ns))
    elif js.state == "failed":
        conditions.append(_condition(FAILED, True, js.finished_ns))
    queued = js.state == "queued"
    status: dict[str, Any] = {
        "restarts": js.restart_attempt,
        "restartsCountTowardsMax": js.restart_attempt,
        "replicatedJobsStatus": [{"name": spec.replicated_job,
                                  "ready": spec.slices if js.state == "running" else 0,
                                  "active": spec.slices if js.state in ("pending", "running") else 0,
                                  "succeeded": spec.slices if js.state == "done" else 0,
                                  "failed": spec.slices if js.state == "failed" else 0,
                                  "suspended": spec.slices if queued else 0}],
    }
    if conditions:
        status["conditions"] = conditions
    if js.state in ("done", "failed"):
        status["terminalState"] = "Completed" if js.state == "done" else "Failed"
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": {
            "name": spec.name,
            "namespace": spec.namespace,
            "uid": js.uid,
            "resourceVersion": str(js.resource_version),
            "generation": js.generation,
            "creationTimestamp": kube.rfc3339(js.created_ns),
            **({"labels": labels} if labels else {}),
            # TPU multislice: each slice's Job on its own node pool
            "annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"},
        },
        "spec": {
            # Kueue's webhook suspends it until its Workload is admitted; `suspend` as the user set it
            "suspend": bool(js.suspend or queued),
            "replicatedJobs": [{"name": spec.replicated_job, "replicas": spec.slices,
                                "template": {"spec": {"parallelism": spec.hosts,
                                                      "completions": spec.hosts,
                                                      "completionMode": "Indexed",
                                                      "backoffLimit": 0,
                                                      "template": pod_template(js)}}}],
            "failurePolicy": {"maxRestarts": 100, "restartStrategy": "Recreate"},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": []},
            "startupPolicy": {"startupPolicyOrder": "AnyOrder"},
            "network": {"enableDNSHostnames": True, "subdomain": spec.name, "publishNotReadyAddresses": True},
        },
        "status": status,
    }


def workload_name(jobset: str, uid: str) -> str:
    """Kueue's name for a JobSet's Workload: `jobset-<name>-` and the first 5 hex digits of the
    SHA-1 of kind, group, name and uid (jobframework.GetWorkloadNameForOwnerWithGVK)."""
    h = hashlib.sha1("\n".join(["JobSet", "jobset.x-k8s.io", jobset, uid]).encode()).hexdigest()
    return f"{('jobset-' + jobset)[:247]}-{h[:5]}"


def pod_sets(js: JobSetState) -> list[dict]:
    """A Workload's spec.podSets: one per replicated job, replicas × parallelism pods."""
    spec = js.spec
    return [{"name": spec.replicated_job, "count": spec.slices * spec.hosts, "template": pod_template(js)}]


def _wl_condition(typ: str, status: bool, reason: str, message: str, at_ns: int | None) -> dict:
    return {"type": typ, "status": "True" if status else "False", "observedGeneration": 1,
            "lastTransitionTime": _ts(at_ns), "reason": reason, "message": message}


def workload_json(js: JobSetState) -> dict:
    w: Workload = js.workload  # type: ignore[assignment]
    spec = js.spec
    conditions = []
    status: dict[str, Any] = {}
    if w.admitted_ns is None:
        flavor = pod_sets_flavor(js)
        need = sum(ps["count"] for ps in w.pod_sets) * CHIPS_PER_HOST
        conditions.append(_wl_condition(
            "QuotaReserved", False, "Pending",
            f"couldn't assign flavors to pod set {spec.replicated_job}: insufficient unused quota for "
            f"{TPU_RESOURCE} in flavor {flavor}, {need} more needed", w.created_ns))
    else:
        conditions.append(_wl_condition("QuotaReserved", True, "QuotaReserved",
                                        f"Quota reserved in ClusterQueue {w.cluster_queue}", w.admitted_ns))
        conditions.append(_wl_condition("Admitted", True, "Admitted", "The workload is admitted", w.admitted_ns))
        status["admission"] = {
            "clusterQueue": w.cluster_queue,
            "podSetAssignments": [{"name": ps["name"], "count": ps["count"],
                                   "flavors": {TPU_RESOURCE: pod_sets_flavor(js)},
                                   "resourceUsage": {TPU_RESOURCE: str(ps["count"] * CHIPS_PER_HOST)}}
                                  for ps in w.pod_sets],
        }
    if w.finished_ns is not None:
        conditions.append(_wl_condition("Finished", True, w.finished_reason, w.finished_message, w.finished_ns))
    status["conditions"] = conditions
    meta: dict[str, Any] = {
        "name": w.name,
        "namespace": spec.namespace,
        "uid": w.uid,
        "resourceVersion": str(w.resource_version),
        "generation": 1,
        "creationTimestamp": kube.rfc3339(w.created_ns),
        "labels": {"kueue.x-k8s.io/job-uid": js.uid},
        "finalizers": ["kueue.x-k8s.io/resource-in-use"],
        "ownerReferences": [{"apiVersion": JOBSET_API, "kind": "JobSet", "name": spec.name, "uid": js.uid,
                             "controller": True, "blockOwnerDeletion": True}],
    }
    if w.deletion_ns is not None:
        meta["deletionTimestamp"] = _ts(w.deletion_ns)
        meta["deletionGracePeriodSeconds"] = 0
    return {
        "apiVersion": WORKLOAD_API,
        "kind": "Workload",
        "metadata": meta,
        "spec": {"active": True, "queueName": w.queue, "podSets": copy.deepcopy(w.pod_sets)},
        "status": status,
    }


def pod_sets_flavor(js: JobSetState) -> str:
    """The ResourceFlavor of the slices: accelerator and topology (e.g. tpu-v5p-slice-4x4x8)."""
    spec = js.spec
    return "-".join(x for x in (spec.accelerator or "tpu", spec.topology) if x)


def namespace_json(name: str) -> dict:
    return {"kind": "Namespace", "apiVersion": "v1",
            "metadata": {"name": name, "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
                         "resourceVersion": "1", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}


def pod_table(pods: list[dict], rv: int) -> dict:
    """`kubectl get pods` columns, with the object in each row (kubectl -o name needs it)."""
    now = time.time()
    rows = []
    for o in pods:
        cs = o["status"]["containerStatuses"][0]
        st = o["status"]["phase"]
        if "waiting" in cs["state"]:
            st = cs["state"]["waiting"]["reason"]
        elif "terminated" in cs["state"]:
            st = cs["state"]["terminated"]["reason"]
        if o["metadata"].get("deletionTimestamp"):
            st = "Terminating"
        created = kube.parse_rfc3339_ns(o["metadata"]["creationTimestamp"]) / 1e9
        age = max(0, int(now - created))
        rows.append({"cells": [o["metadata"]["name"], f"{int(cs['ready'])}/1", st, cs["restartCount"],
                               f"{age}s" if age < 120 else f"{age // 60}m",
                               o["status"].get("podIP", "<none>"), o["spec"]["nodeName"]],
                     "object": o})
    cols = [("Name", "string", "name"), ("Ready", "string", ""), ("Status", "string", ""),
            ("Restarts", "integer", ""), ("Age", "string", ""), ("IP", "string", ""),
            ("Node", "string", "")]
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": str(rv)},
            "columnDefinitions": [{"name": n, "type": t, "format": f, "description": n,
                                   "priority": 0 if i < 5 else 1}
                                  for i, (n, t, f) in enumerate(cols)],
            "rows": rows}


def jobset_table(items: list[dict], rv: int) -> dict:
    rows = [{"cells": [o["metadata"]["name"], o["status"]["restarts"],
                       o["status"].get("terminalState") or "", o["metadata"]["creationTimestamp"]],
             "object": o} for o in items]
    cols = ["Name", "Restarts", "TerminalState", "Created"]
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": str(rv)},
            "columnDefinitions": [{"name": c, "type": "integer" if c == "Restarts" else "string",
                                   "format": "name" if c == "Name" else "", "description": c,
                                   "priority": 0} for c in cols],
            "rows": rows}


def _age(created: str, now: float) -> str:
    age = max(0, int(now - kube.parse_rfc3339_ns(created) / 1e9))
    return f"{age}s" if age < 120 else f"{age // 60}m"


def _condition_status(o: dict, typ: str) -> str:
    return next((c["status"] for c in o["status"].get("conditions", []) if c["type"] == typ), "")


def workload_table(items: list[dict], rv: int) -> dict:
    """The Workload CRD's printer columns (Queue, Reserved in, Admitted, Finished, Age)."""
    now = time.time()
    rows = [{"cells": [o["metadata"]["name"], o["spec"]["queueName"],
                       o["status"].get("admission", {}).get("clusterQueue", ""),
                       _condition_status(o, "Admitted"), _condition_status(o, "Finished"),
                       _age(o["metadata"]["creationTimestamp"], now)],
             "object": o} for o in items]
    cols = [("Name", "name", "Name must be unique within a namespace."),
            ("Queue", "", "Name of the queue this workload was submitted to"),
            ("Reserved in", "", "Name of the ClusterQueue where the workload is reserving quota"),
            ("Admitted", "", "Admission status"), ("Finished", "", "Workload finished"),
            ("Age", "", "Time this workload was created")]
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": str(rv)},
            "columnDefinitions": [{"name": n, "type": "string", "format": f, "description": d, "priority": 0}
                                  for n, f, d in cols],
            "rows": rows}


def table(kind: str, items: list[dict], rv: int) -> dict:
    if kind == "pods":
        return pod_table(items, rv)
    return jobset_table(items, rv) if kind == "jobsets" else workload_table(items, rv)
