"""A hostile (or compromised, or misconfigured) API server: what the simulator serves when a
test wants the cluster's answers to be input an attacker chose.

- `relabel`: a JobSet's pods served with another `jobset-name` label (a traversal like
  `../../../../tmp/x`, a name with a space, 300 characters, …) — the pods and their logs stay
  real, so a collector that trusted the label would follow them under that name;
- `rename`: pods served with another name or container name (the log stays under the real one);
- `flood`: that many extra process-0 pods (each of its own JobSet, Pending forever) in every
  pod list, e.g. 20,000;
- `garble`: the next N answers to a pod list, get or watch are not JSON;
- `ignore_limit`: list answers whole, `limit` ignored (with `flood`: one answer of many MB).

List answers honour `limit` and `continue` like the apiserver (`page`). Plain state, read
under ClusterState.lock by api.py's hooks; a default Hostile changes nothing."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

from aiohttp import web

JOBSET = "jobset.sigs.k8s.io/jobset-name"
PROCESS0 = {"jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-completion-index": "0",
            "jobset.sigs.k8s.io/restart-attempt": "0"}
GARBAGE = b'{"kind": "PodList", "items": [{"metadata": \x00\xff not json'


@dataclass
class Hostile:
    relabel: dict[str, str] = field(default_factory=dict)  # real jobset -> label value served
    rename: dict[str, dict] = field(default_factory=dict)  # real jobset -> {"pod": …, "container": …}
    flood: int = 0  # extra Pending process-0 pods, one JobSet each
    flood_name: str = "flood-{i}"  # their JobSet label (e.g. "../flood {i}": every one unsafe)
    garble: dict[str, int] = field(default_factory=dict)  # "list" | "get" | "watch" -> answers left
    pages: int = 0  # list answers cut by `limit` (to tell paging happened)
    ignore_limit: bool = False  # list answers whole, whatever `limit` asked (a server that ignores it)
    _flooded: tuple = (None, 0, [])  # (namespace, flood, pods) last served

    def served(self, o: dict) -> dict:
        """A pod as list, watch and get serve it."""
        if o.get("kind") != "Pod":
            return o
        labels = o["metadata"].get("labels", {})
        js = labels.get(JOBSET)
        if js in self.relabel:
            o = {**o, "metadata": {**o["metadata"], "labels": {**labels, JOBSET: self.relabel[js]}}}
        if js in self.rename:
            new = self.rename[js]
            meta = {**o["metadata"], "name": new.get("pod", o["metadata"]["name"])}
            spec, status = dict(o.get("spec", {})), dict(o.get("status", {}))
            if "container" in new:
                spec["containers"] = [{**c, "name": new["container"]} for c in spec.get("containers", [])]
                status["containerStatuses"] = [{**c, "name": new["container"]}
                                               for c in status.get("containerStatuses", [])]
            o = {**o, "metadata": meta, "spec": spec, "status": status}
        return o

    def listed(self, items: list[dict], match, namespace: str | None) -> list[dict]:
        """The pods of a list answer: the real ones, then the flood."""
        if not self.flood:
            return items
        ns = namespace or "default"
        if self._flooded[:2] != (ns, self.flood):  # (flood_name is set before the first list)  # built once: a list of 20,000 is asked for page by page
            self._flooded = (ns, self.flood, [flood_pod(i, ns, self.flood_name) for i in range(self.flood)])
        return items + [p for p in self._flooded[2] if match(p)]

    def pod(self, namespace: str, name: str) -> dict | None:
        """A flood pod by name, for a get (None: not one of the flood)."""
        i = name.removeprefix("flood-").removesuffix("-slice-0-0-aaaaa")
        if name.startswith("flood-") and i.isdecimal() and int(i) < self.flood:
            return flood_pod(int(i), namespace)
        return None

    def page(self, items: list[dict], query) -> tuple[list[dict], str | None]:
        """`limit`/`continue` of a list: (this page, the token of the next or None)."""
        start = 0
        if query.get("continue"):
            try:
                start = int(base64.urlsafe_b64decode(query["continue"]).decode())
            except ValueError:
                raise web.HTTPBadRequest(text="invalid continue token") from None
        limit = int(query.get("limit") or 0)
        if limit <= 0 or self.ignore_limit:
            return items[start:], None
        self.pages += 1
        end = start + limit
        token = base64.urlsafe_b64encode(str(end).encode()).decode() if end < len(items) else None
        return items[start:end], token

    def garbage(self, request: web.Request) -> web.Response | None:
        """A body no client can read, for the next `garble[verb]` pod reads (logs untouched)."""
        path = request.path
        if "/pods" not in path or path.endswith("/log"):
            return None
        if request.query.get("watch") in ("true", "1", "True"):
            verb = "watch"
        else:
            verb = "list" if path.rstrip("/").endswith("/pods") else "get"
        if self.garble.get(verb, 0) <= 0:
            return None
        self.garble[verb] -= 1
        return web.Response(body=GARBAGE + b"\n", content_type="application/json")


def flood_pod(i: int, namespace: str, label: str = "flood-{i}") -> dict:
    """One Pending process-0 pod of JobSet `flood-<i>` (labelled `label`): it never starts, so
    it never logs."""
    name = f"flood-{i}"
    return {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": f"{name}-slice-0-0-aaaaa", "namespace": namespace, "uid": f"flood-uid-{i:06d}",
                     "resourceVersion": "1", "creationTimestamp": "2026-01-01T00:00:00Z",
                     "labels": {JOBSET: label.format(i=i), **PROCESS0}},
        "spec": {"containers": [{"name": "jax-tpu", "image": "flood"}]},
        "status": {"phase": "Pending",
                   "containerStatuses": [{"name": "jax-tpu", "ready": False, "restartCount": 0, "image": "flood",
                                          "imageID": "", "state": {"waiting": {"reason": "ContainerCreating"}}}]},
    }
