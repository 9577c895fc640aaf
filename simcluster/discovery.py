"""Legacy API discovery documents (kubectl falls back to them from aggregated discovery;
`/openapi/*` stays 404, which kubectl copes with). Read-only: pods, pods/log, JobSets, Kueue
Workloads."""

from __future__ import annotations

VERSION = {
    "major": "1", "minor": "32", "gitVersion": "v1.32.2-gke.1182003",
    "gitCommit": "0" * 40, "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.23.6", "compiler": "gc", "platform": "linux/amd64",
}

_JOBSET_GROUP = {
    "name": "jobset.x-k8s.io",
    "versions": [{"groupVersion": "jobset.x-k8s.io/v1alpha2", "version": "v1alpha2"}],
    "preferredVersion": {"groupVersion": "jobset.x-k8s.io/v1alpha2", "version": "v1alpha2"},
}

_KUEUE_GROUP = {
    "name": "kueue.x-k8s.io",
    "versions": [{"groupVersion": "kueue.x-k8s.io/v1beta1", "version": "v1beta1"}],
    "preferredVersion": {"groupVersion": "kueue.x-k8s.io/v1beta1", "version": "v1beta1"},
}

_RO = ["get", "list", "watch"]

# path -> document, for the paths whose answer never changes
STATIC = {
    "/version": VERSION,
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_JOBSET_GROUP, _KUEUE_GROUP]},
    "/apis/jobset.x-k8s.io": {"kind": "APIGroup", "apiVersion": "v1", **_JOBSET_GROUP},
    "/apis/kueue.x-k8s.io": {"kind": "APIGroup", "apiVersion": "v1", **_KUEUE_GROUP},
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        {"name": "namespaces", "singularName": "namespace", "namespaced": False, "kind": "Namespace",
         "verbs": ["get", "list"], "shortNames": ["ns"]},
        {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "verbs": _RO,
         "shortNames": ["po"], "categories": ["all"]},
        {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
        {"name": "pods/status", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
    ]},
    "/apis/jobset.x-k8s.io/v1alpha2": {"kind": "APIResourceList", "apiVersion": "v1",
                                       "groupVersion": "jobset.x-k8s.io/v1alpha2", "resources": [
                                           {"name": "jobsets", "singularName": "jobset", "namespaced": True,
                                            "kind": "JobSet", "verbs": _RO},
                                           {"name": "jobsets/status", "singularName": "", "namespaced": True,
                                            "kind": "JobSet", "verbs": ["get"]}]},
    # only the Workloads of Kueue's resources (the CRD: short name wl)
    "/apis/kueue.x-k8s.io/v1beta1": {"kind": "APIResourceList", "apiVersion": "v1",
                                     "groupVersion": "kueue.x-k8s.io/v1beta1", "resources": [
                                         {"name": "workloads", "singularName": "workload", "namespaced": True,
                                          "kind": "Workload", "verbs": _RO, "shortNames": ["wl"]},
                                         {"name": "workloads/status", "singularName": "", "namespaced": True,
                                          "kind": "Workload", "verbs": ["get"]}]},
}


def api_versions(address: str) -> dict:
    """`/api`: names the server's own host:port."""
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}]}
