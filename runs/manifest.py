"""A JobSet as the runbook rules see it: its manifest text split into JobSets, and plain views
of the JobSet, its pod templates (or live pods), the trainer container, its MaxText `key=value`
overrides and its gcsfuse volumes. Pure: text and dicts in, dicts out (no I/O)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from steptail.runs import safe_yaml
from steptail.runs.names import printed
from steptail.runs.safe_yaml import LOADER  # noqa: F401  (libyaml's loader, for callers that had it here)

JOBSET_KIND = "JobSet"
JOBSET_GROUP = "jobset.x-k8s.io"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
TOPOLOGY_SELECTOR = "cloud.google.com/gke-tpu-topology"
ACCELERATOR_SELECTOR = "cloud.google.com/gke-tpu-accelerator"
TPU_RESOURCE = "google.com/tpu"
GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
# Labels a live pod of a JobSet carries (JobSet and Job controllers).
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

# Chips per host of each GKE TPU accelerator type (`cloud.google.com/gke-tpu-accelerator`), for
# the hosts a slice topology needs (its chips ÷ chips per host). Multi-host slices only: a
# single-host machine type (v5e/v6e ct*-1t/-8t) sets its own chip count and is not in this
# table, so such a slice is "not evaluable" rather than guessed.
CHIPS_PER_HOST = {
    "tpu-v4-podslice": 4,  # ct4p-hightpu-4t
    "tpu-v5p-slice": 4,  # ct5p-hightpu-4t
    "tpu-v5-lite-podslice": 4,  # ct5lp-hightpu-4t, its multi-host machine type
    "tpu-v6e-slice": 4,  # ct6e-standard-4t, its multi-host machine type
}
_TOPOLOGY = re.compile(r"[1-9][0-9]*(x[1-9][0-9]*){1,2}")
_OVERRIDE = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)=(.*)", re.S)


class ManifestError(ValueError):
    """A manifest that is not YAML, or a JobSet that is not shaped like one: one line."""


@dataclass(frozen=True)
class Document:
    index: int  # position in the file, from 0
    kind: str
    name: str
    body: dict


def split_manifest(text: str, source: str) -> tuple[list[Document], list[str]]:
    """The JobSets of a (multi-document) YAML file, and a note for each other object it holds.
    A `kind: List` (kubectl get -o yaml) counts as its items."""
    try:  # bounded: an alias bomb or a recursive alias is refused before it is expanded
        docs = [as_api_server_stores(d) for d in safe_yaml.load_all(text)]
    except safe_yaml.YamlError as exc:
        raise ManifestError(f"{source}: {exc}") from None
    items: list[tuple[int, object]] = []
    for i, doc in enumerate(docs):
        if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            items.extend((i, item) for item in doc["items"])
        else:
            items.append((i, doc))
    jobsets, notes = [], []
    for i, doc in items:
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ManifestError(f"{source}: document {i + 1} is not a Kubernetes object (a {type(doc).__name__})")
        kind = doc.get("kind")
        name = ((doc.get("metadata") or {}) if isinstance(doc.get("metadata"), dict) else {}).get("name") or ""
        if kind != JOBSET_KIND:
            what = f"{printed(kind) if kind else 'no kind'} {printed(name) if name else ''}".strip()
            notes.append(f"{source}: document {i + 1} ({what}) is not a JobSet: ignored")
            continue
        api = str(doc.get("apiVersion", ""))
        if api.split("/")[0] != JOBSET_GROUP:
            raise ManifestError(f"{source}: document {i + 1}: JobSet {printed(name)} has apiVersion {api!r}, "
                                f"not {JOBSET_GROUP}/…")
        check_jobset(doc, f"{source}: document {i + 1}")
        jobsets.append(Document(i, kind, name, doc))
    return jobsets, notes


# Fields Kubernetes types as strings (maps of string to string, lists of strings): a YAML scalar
# there is read as the text the API server would hold (`true`, `5`; a null as "", as Go's JSON
# decoding leaves a string), so the rules never meet a bool, a number or None where they read text.
_STRING_MAPS = frozenset({"labels", "annotations", "nodeSelector", "volumeAttributes"})
_STRING_LISTS = frozenset({"args", "command"})


def as_api_server_stores(value, key: str = ""):
    """`value` (safe_yaml's plain data) with the string-typed fields' scalars as strings: labels,
    annotations, nodeSelector, volumeAttributes, command, args, and env values. A new object:
    safe_yaml shares aliased nodes. Depth is bounded by safe_yaml.MAX_DEPTH."""
    if isinstance(value, dict):
        if key in _STRING_MAPS:
            return {k: _as_string(v) for k, v in value.items()}
        return {k: as_api_server_stores(v, k) for k, v in value.items()}
    if isinstance(value, list):
        if key in _STRING_LISTS:
            return [_as_string(v) for v in value]
        if key == "env":
            return [{**e, "value": _as_string(e["value"])} if isinstance(e, dict) and "value" in e else e
                    for e in (as_api_server_stores(v) for v in value)]
        return [as_api_server_stores(v) for v in value]
    return value


def _as_string(v):
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    return v  # a string, or a mapping or list where text belongs: check_jobset's to refuse


def _expect(value, kind: type, where: str, what: str):
    if not isinstance(value, kind):
        raise ManifestError(f"{where}: {what} must be {'a mapping' if kind is dict else 'a list'}, "
                            f"not {type(value).__name__}")
    return value


def check_jobset(doc: dict, where: str) -> None:
    """The parts the views read have the types Kubernetes gives them."""
    meta = _expect(doc.get("metadata", {}), dict, where, "metadata")
    if not meta.get("name"):
        raise ManifestError(f"{where}: the JobSet has no metadata.name")
    for key in ("labels", "annotations"):
        _expect(meta.get(key) or {}, dict, where, f"metadata.{key}")
    spec = _expect(doc.get("spec"), dict, where, "spec")
    rjobs = _expect(spec.get("replicatedJobs"), list, where, "spec.replicatedJobs")
    if not rjobs:
        raise ManifestError(f"{where}: spec.replicatedJobs is empty")
    for j, rj in enumerate(rjobs):
        at = f"spec.replicatedJobs[{j}]"
        rj = _expect(rj, dict, where, at)
        for key in ("replicas",):
            if key in rj and (isinstance(rj[key], bool) or not isinstance(rj[key], int)):
                raise ManifestError(f"{where}: {at}.{key} must be an integer")
        jspec = _expect(_get(rj, "template", "spec"), dict, where, f"{at}.template.spec")
        if "parallelism" in jspec and (isinstance(jspec["parallelism"], bool) or not isinstance(jspec["parallelism"], int)):
            raise ManifestError(f"{where}: {at}.template.spec.parallelism must be an integer")
        check_pod(_get(jspec, "template") or {}, where, f"{at}.template.spec.template")


def check_pod(pod: dict, where: str, at: str) -> None:
    pod = _expect(pod, dict, where, at)
    pspec = _expect(pod.get("spec"), dict, where, f"{at}.spec")
    containers = _expect(pspec.get("containers"), list, where, f"{at}.spec.containers")
    for c, cont in enumerate(containers):
        cont = _expect(cont, dict, where, f"{at}.spec.containers[{c}]")
        for key in ("command", "args"):
            _expect(cont.get(key) or [], list, where, f"{at}.spec.containers[{c}].{key}")
    _expect(pspec.get("nodeSelector") or {}, dict, where, f"{at}.spec.nodeSelector")
    for v, vol in enumerate(_expect(pspec.get("volumes") or [], list, where, f"{at}.spec.volumes")):
        _expect(vol, dict, where, f"{at}.spec.volumes[{v}]")


def _get(d, *keys):
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _str(v) -> str:
    return "" if v is None else str(v)


# -- views -----------------------------------------------------------------------------------


def overrides(tokens: list[str]) -> dict[str, str]:
    """MaxText's `key=value` arguments (after the config file): the last one of a key wins."""
    out: dict[str, str] = {}
    for t in tokens:
        m = _OVERRIDE.fullmatch(t)
        if m:
            out[m[1]] = m[2]
    return out


def tokens(container: dict) -> list[str]:
    """command + args, each element split as a shell would (`bash -c "python3 -m … k=v"`)."""
    out: list[str] = []
    for part in [*(container.get("command") or []), *(container.get("args") or [])]:
        part = _str(part)
        try:
            out.extend(shlex.split(part) if any(ch.isspace() for ch in part) else [part])
        except ValueError:  # an unbalanced quote: split on blanks
            out.extend(part.split())
    return out


def _tpu(container: dict) -> bool:
    res = container.get("resources") or {}
    return any(TPU_RESOURCE in (res.get(k) or {}) for k in ("limits", "requests") if isinstance(res.get(k), dict))


def trainer_index(containers: list[dict], name: str = "") -> int:
    """The trainer: the container named `name`, else the first asking for TPUs, else the first."""
    if name:
        for i, c in enumerate(containers):
            if c.get("name") == name:
                return i
    return next((i for i, c in enumerate(containers) if _tpu(c)), 0)


def mount_options(attrs: dict) -> list[str]:
    raw = attrs.get("mountOptions") or ""
    parts = raw if isinstance(raw, list) else str(raw).split(",")
    return [str(p).strip() for p in parts if str(p).strip()]


def only_dir(options: list[str]) -> str:
    """The `only-dir` (slashes trimmed), "" when the whole bucket is mounted."""
    value = ""
    for o in options:
        key, sep, v = o.partition("=") if "=" in o else o.partition(":")
        if sep and key.strip() == "only-dir":
            value = v.strip().strip("/")
    return value


def volume_view(vol: dict, path: str) -> dict | None:
    csi = vol.get("csi")
    if not isinstance(csi, dict) or csi.get("driver") != GCSFUSE_DRIVER:
        return None
    attrs = csi.get("volumeAttributes") or {}
    opts = mount_options(attrs)
    return {"name": _str(vol.get("name")), "path": path, "bucket": _str(attrs.get("bucketName")),
            "mount_options": opts, "only_dir": only_dir(opts)}


def tpu_chips(container: dict) -> int:
    """The container's google.com/tpu (its limit, else its request): 0 when it asks for none,
    -1 when the value is not a whole number."""
    res = container.get("resources") or {}
    for k in ("limits", "requests"):
        asked = res.get(k)
        if isinstance(asked, dict) and TPU_RESOURCE in asked:
            value = asked[TPU_RESOURCE]
            if isinstance(value, bool):
                return -1
            try:
                return int(str(value).strip())
            except ValueError:
                return -1
    return 0


def slice_view(topology: str, accelerator: str) -> dict:
    """What the node selectors say of one slice: its chips (the product of the topology's
    dimensions; 0 when the topology is absent or not NxM[xK]), the accelerator's chips per host
    (0: unknown type) and so the hosts it has (0 when either is unknown)."""
    chips = 0
    if _TOPOLOGY.fullmatch(topology):
        chips = 1
        for d in topology.split("x"):
            chips *= int(d)
    per_host = CHIPS_PER_HOST.get(accelerator, 0)
    hosts = chips // per_host if chips and per_host and chips % per_host == 0 else 0
    return {"chips": chips, "chips_per_host": per_host, "hosts": hosts}


def pod_view(pod: dict, path: str, *, replicated_job: str, replicas: int, parallelism: int,
             process0: bool, trainer_name: str = "", live: bool = False, completions: int = -1) -> dict:
    """One pod template (or live pod) as the rules see it, `path` its place in the object."""
    spec = pod.get("spec") or {}
    meta = pod.get("metadata") or {}
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    selector = {str(k): _str(v) for k, v in (spec.get("nodeSelector") or {}).items()}
    trainer = {"name": "", "image": "", "args": [], "overrides": {}, "path": f"{path}.spec.containers"}
    if containers:
        i = trainer_index(containers, trainer_name)
        c = containers[i]
        args = tokens(c)
        trainer = {"name": _str(c.get("name")), "image": _str(c.get("image")), "args": args,
                   "overrides": overrides(args), "path": f"{path}.spec.containers[{i}]"}
    volumes = []
    for v, vol in enumerate(spec.get("volumes") or []):
        view = volume_view(vol, f"{path}.spec.volumes[{v}]") if isinstance(vol, dict) else None
        if view is not None:
            volumes.append(view)
    topology, accelerator = selector.get(TOPOLOGY_SELECTOR, ""), selector.get(ACCELERATOR_SELECTOR, "")
    return {
        "name": _str(meta.get("name")) or replicated_job, "path": path, "live": live,
        "replicated_job": replicated_job, "replicas": replicas, "parallelism": parallelism,
        "completions": completions,  # -1: not set
        # google.com/tpu of the first container asking for it (0: none does)
        "tpu_chips": next((n for n in map(tpu_chips, containers) if n), 0),
        "slice": slice_view(topology, accelerator),
        "process0": process0, "tpu": any(_tpu(c) for c in containers) or TOPOLOGY_SELECTOR in selector,
        "topology": topology, "accelerator": accelerator,
        "node_selector": selector, "labels": {str(k): _str(v) for k, v in (meta.get("labels") or {}).items()},
        "containers": [{"name": _str(c.get("name")), "image": _str(c.get("image"))} for c in containers],
        "trainer": trainer, "volumes": volumes,
    }


def _count(v, default: int = 1) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else default


def templates(jobset: dict, trainer_name: str = "") -> list[dict]:
    """The pod template of each replicated job. Process 0's is the first TPU one's (the first
    replicated job's when none asks for TPUs): JAX numbers processes in replicated-job order."""
    out = []
    for j, rj in enumerate(_get(jobset, "spec", "replicatedJobs") or []):
        jspec = _get(rj, "template", "spec") or {}
        out.append(pod_view(jspec.get("template") or {}, f"spec.replicatedJobs[{j}].template.spec.template",
                            replicated_job=_str(rj.get("name")), replicas=_count(rj.get("replicas")),
                            parallelism=_count(jspec.get("parallelism")), process0=False,
                            trainer_name=trainer_name, completions=_count(jspec.get("completions"), -1)))
    first = next((t for t in out if t["tpu"]), out[0] if out else None)
    if first is not None:
        first["process0"] = True
    return out


def live_pod(pod: dict, jobset_templates: list[dict], trainer_name: str = "") -> dict:
    """A live pod of the JobSet: its replicated job's replicas and parallelism from the
    template; process 0 is job 0, completion index 0, of process 0's replicated job."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    rjob = _str(labels.get(REPLICATED_JOB_LABEL))
    tmpl = next((t for t in jobset_templates if t["replicated_job"] == rjob), None)
    index = _str(labels.get(COMPLETION_INDEX) or annotations.get(COMPLETION_INDEX))
    process0 = bool(tmpl and tmpl["process0"]) and _str(labels.get(JOB_INDEX_LABEL)) == "0" and index == "0"
    return pod_view(pod, f"pods/{_str(meta.get('name'))}", replicated_job=rjob,
                    replicas=tmpl["replicas"] if tmpl else 1, parallelism=tmpl["parallelism"] if tmpl else 1,
                    process0=process0, trainer_name=trainer_name, live=True,
                    completions=tmpl["completions"] if tmpl else -1)


def shape(pods: list[dict]) -> dict:
    """The slice shape: process 0's topology and the host count (replicas x parallelism of the
    TPU replicated jobs; of all when none asks for TPUs)."""
    tpu = [p for p in pods if p["tpu"] and not p["live"]] or [p for p in pods if not p["live"]]
    p0 = next((p for p in pods if p["process0"] and not p["live"]), None)
    return {"topology": p0["topology"] if p0 else "", "hosts": sum(p["replicas"] * p["parallelism"] for p in tpu),
            "slices": sum(p["replicas"] for p in tpu)}


def jobset_view(jobset: dict, pods: list[dict]) -> dict:
    meta = jobset.get("metadata") or {}
    labels = {str(k): _str(v) for k, v in (meta.get("labels") or {}).items()}
    s = shape(pods)
    return {
        "name": _str(meta.get("name")), "namespace": _str(meta.get("namespace")), "labels": labels,
        "queue": labels.get(QUEUE_LABEL, ""), "suspend": _get(jobset, "spec", "suspend") is True,
        "topology": s["topology"], "topologies": sorted({p["topology"] for p in pods if p["topology"]}),
        "hosts": s["hosts"], "slices": s["slices"],
    }
