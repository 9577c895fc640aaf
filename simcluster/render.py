"""The Kubernetes JSON of the simulated objects, as the API serves them and watch events
carry them, and the Table form kubectl's printer asks for (`Accept: …as=Table…`)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from steptail.simcluster import kube
from steptail.simcluster.objects import CONTAINER, IMAGE, JobSetState, Pod


def _ts(ns: int | None) -> str | None:
    return kube.rfc3339(ns) if ns else None


def pod_json(p: Pod) -> dict:
    inst = p.current
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
        "image": IMAGE,
        "imageID": IMAGE + "@sha256:" + "0" * 64,
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
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": meta,
        "spec": {
            "containers": [{"name": CONTAINER, "image": IMAGE,
                            "command": ["python3", "-m", "maxtext.trainers.post_train.sft.train_sft"],
                            "resources": {"limits": {"google.com/tpu": "4"}}}],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "nodeName": p.node,
            "subdomain": p.jobset,
            "hostname": p.name[:-6],
            "schedulerName": "default-scheduler",
            "nodeSelector": {"cloud.google.com/gke-tpu-topology": "4x4x8",
                             "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice"},
        },
        "status": status,
    }


def jobset_json(js: JobSetState) -> dict:
    spec = js.spec
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": spec.name,
            "namespace": spec.namespace,
            "uid": js.uid,
            "resourceVersion": str(js.resource_version),
            "creationTimestamp": kube.rfc3339(js.created_ns),
            "labels": {"kueue.x-k8s.io/queue-name": "tpu-queue"},
        },
        "spec": {
            "replicatedJobs": [{"name": spec.replicated_job, "replicas": spec.slices,
                                "template": {"spec": {"parallelism": spec.hosts,
                                                      "completions": spec.hosts,
                                                      "completionMode": "Indexed"}}}],
            "failurePolicy": {"maxRestarts": 100},
        },
        "status": {
            "restarts": js.restart_attempt,
            "terminalState": "Completed" if js.state == "done" else None,
            "replicatedJobsStatus": [{"name": spec.replicated_job,
                                      "ready": spec.slices if js.state == "running" else 0,
                                      "active": spec.slices if js.state != "done" else 0,
                                      "succeeded": spec.slices if js.state == "done" else 0,
                                      "failed": 0, "suspended": 0}],
        },
    }


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


def table(kind: str, items: list[dict], rv: int) -> dict:
    return pod_table(items, rv) if kind == "pods" else jobset_table(items, rv)
