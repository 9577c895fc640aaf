"""Scenario files for the simulated cluster (YAML or JSON). See docs/simcluster.md."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

TRAINER_KEYS = {
    "run_name", "steps", "seed", "context_parallelism", "load_balance", "checkpoint_period",
    "nan_steps", "no_rbf_steps", "replay_ce_offset", "step_seconds",
}
ACTIONS = {
    "stamp_skew", "clock_step", "db_outage", "db_restore", "slow_api", "hang_api", "watch_gone",
    "rotate", "restart_jobset", "restart_container", "auth_lapse", "fail_next", "eof_streams",
    "stall", "set_rate", "deny", "corrupt_pods", "write_lines", "flood", "delete_pod",
    "garbage", "endless_line", "set_image", "suspend", "fail_jobset", "repeat_lines", "throttle",
}
# JobSet fields a real object may lack (`omit` key): what another tool wrote, or a JobSet
# the controller has not reconciled yet (no status). Pods keep their own (a pod needs an image).
# Not the labels: without the queue label Kueue would not manage it (that is `queue: ""`).
OMITTABLE = {"image", "annotations", "status", "nodeSelector", "args", "resources", "volumes"}

# The restore-fix image (runs/runbook.yaml `settings.image`): every runbook rule is kept by default.
DEFAULT_IMAGE = "us-docker.pkg.dev/steptail-sim/maxtext/maxtext-posttrain:51f8cc4b-p907d86f3-rfb46e215e"
DEFAULT_BUCKET = "post-training"
_VOLUME_KEYS = {"name", "bucket", "only_dir", "mount_path", "read_only", "mount_options"}


def default_volumes() -> list[dict]:
    """Two read-only gcsfuse mounts of the folders a run reads, never the one holding checkpoints."""
    return [normalize_volume({"name": "data", "bucket": DEFAULT_BUCKET, "only_dir": "post-training/data",
                              "mount_path": "/data"}, 0),
            normalize_volume({"name": "tokenizers", "bucket": DEFAULT_BUCKET,
                              "only_dir": "post-training/tokenizers", "mount_path": "/tokenizers"}, 1)]


_INTEGERS = {"steps", "seed", "context_parallelism", "checkpoint_period", "slices", "hosts"}
_NUMBERS = {"replay_ce_offset", "step_seconds", "rate", "pending_seconds", "start_after", "queued_seconds"}
_STRINGS = {"queue", "image", "topology", "accelerator"}
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _check_numbers(d: dict, where: str) -> None:
    """Wrong-typed values fail here, at load, not in the running simulator."""
    for k in sorted(d.keys() & (_INTEGERS | _NUMBERS)):
        v = d[k]
        if isinstance(v, bool) or not isinstance(v, int if k in _INTEGERS else int | float):
            raise ValueError(f"{where} `{k}` must be {'an integer' if k in _INTEGERS else 'a number'}, got {v!r}")


def _check_strings(d: dict) -> None:
    for k in sorted(d.keys() & _STRINGS):
        if not isinstance(d[k], str):
            raise ValueError(f"jobset `{k}` must be a string, got {d[k]!r}")
    if "image" in d and not d["image"].strip():
        raise ValueError("jobset `image` must not be empty")
    if "suspend" in d and not isinstance(d["suspend"], bool):
        raise ValueError(f"jobset `suspend` must be true or false, got {d['suspend']!r}")
    if "omit" in d and (not isinstance(d["omit"], list) or not set(d["omit"]) <= OMITTABLE):
        raise ValueError(f"jobset `omit` must be a list of {sorted(OMITTABLE)}, got {d['omit']!r}")
    for k in ("start_after", "queued_seconds", "pending_seconds"):
        if k in d and d[k] < 0:
            raise ValueError(f"jobset `{k}` must not be negative, got {d[k]!r}")


def normalize_args(v) -> list[str]:
    """`args`: extra MaxText `key=value` overrides, a list of strings or a mapping."""
    if v is None:
        return []
    if isinstance(v, dict):
        out = []
        for k, val in v.items():
            if not isinstance(k, str) or not k or isinstance(val, dict | list) or val is None:
                raise ValueError(f"jobset `args` mapping wants key: scalar, got {k!r}: {val!r}")
            out.append(f"{k}={val}")  # a bool prints True/False, as MaxText reads it
        return out
    if isinstance(v, list) and all(isinstance(a, str) for a in v):
        return list(v)
    raise ValueError(f"jobset `args` must be a list of strings or a mapping, got {v!r}")


def normalize_volume(v, i: int) -> dict:
    """One gcsfuse CSI volume of the trainer's pods: `name`, `bucket`, `only_dir` ("" or absent:
    the whole bucket), `mount_path` (default /mnt/<name>), `read_only` (default true) and
    `mount_options` (default [implicit-dirs]; `only-dir=` is added from `only_dir`)."""
    where = f"jobset `volumes[{i}]`"
    if not isinstance(v, dict):
        raise ValueError(f"{where} must be a mapping, got {v!r}")
    bad = set(v) - _VOLUME_KEYS
    if bad:
        raise ValueError(f"{where}: unknown keys {sorted(bad)} (known: {sorted(_VOLUME_KEYS)})")
    for k in ("name", "bucket"):
        if not isinstance(v.get(k), str) or not v[k]:
            raise ValueError(f"{where} needs `{k}` (a string)")
    if not _NAME.fullmatch(v["name"]):
        raise ValueError(f"{where}: name {v['name']!r} is not a DNS label")
    only_dir = v.get("only_dir") or ""
    mount_path = v.get("mount_path", f"/mnt/{v['name']}")
    read_only = v.get("read_only", True)
    opts = v.get("mount_options", ["implicit-dirs"])
    if isinstance(opts, str):
        opts = [o.strip() for o in opts.split(",") if o.strip()]
    if not isinstance(only_dir, str) or not isinstance(mount_path, str) or not mount_path.startswith("/"):
        raise ValueError(f"{where}: `only_dir` must be a string and `mount_path` an absolute path")
    if not isinstance(read_only, bool):
        raise ValueError(f"{where}: `read_only` must be true or false, got {read_only!r}")
    if not isinstance(opts, list) or not all(isinstance(o, str) for o in opts):
        raise ValueError(f"{where}: `mount_options` must be a list of strings or a comma-joined string")
    return {"name": v["name"], "bucket": v["bucket"], "only_dir": only_dir, "mount_path": mount_path,
            "read_only": read_only, "mount_options": list(opts)}


def normalize_volumes(v) -> list[dict]:
    if not isinstance(v, list):
        raise ValueError(f"jobset `volumes` must be a list, got {v!r}")
    out = [normalize_volume(x, i) for i, x in enumerate(v)]
    names = [x["name"] for x in out]
    if len(set(names)) != len(names):
        raise ValueError(f"jobset `volumes`: names must be unique, got {names}")
    return out


def _check_trainer_types(trainer: dict) -> None:
    if "load_balance" in trainer and not isinstance(trainer["load_balance"], bool):
        raise ValueError(f"trainer `load_balance` must be true or false, got {trainer['load_balance']!r}")
    if "run_name" in trainer and not isinstance(trainer["run_name"], str):
        raise ValueError(f"trainer `run_name` must be a string, got {trainer['run_name']!r}")


def parse_size(v) -> int:
    """`10Mi`, `512Ki`, `1G`, `4096` -> bytes."""
    if isinstance(v, int):
        return v
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]i?)?\s*", str(v))
    if not m:
        raise ValueError(f"bad size {v!r}")
    n, unit = int(m.group(1)), m.group(2) or ""
    mult = {"": 1, "K": 1000, "M": 10**6, "G": 10**9, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}[unit]
    return n * mult


@dataclass
class JobSetSpec:
    name: str = "olmo3-sft"
    namespace: str = "default"
    replicated_job: str = "slice"
    slices: int = 1
    hosts: int = 4
    rate: float = 1.0  # trainer steps per second
    pending_seconds: float = 0.0
    trainer: dict = field(default_factory=dict)
    # What the runbook rules read (runs/runbook.yaml); the defaults keep every rule.
    queue: str = "post-training"  # kueue.x-k8s.io/queue-name ("": no label, no Kueue Workload)
    image: str = DEFAULT_IMAGE  # the trainer's image (set_image changes it for later pods)
    topology: str = "4x4x8"  # cloud.google.com/gke-tpu-topology node selector ("": none)
    accelerator: str = "tpu-v5p-slice"  # cloud.google.com/gke-tpu-accelerator node selector ("": none)
    volumes: list[dict] = field(default_factory=default_volumes)  # gcsfuse CSI volumes (normalize_volume)
    args: list[str] = field(default_factory=list)  # extra MaxText key=value overrides, after the trainer's
    suspend: bool = False  # spec.suspend as written (Kueue admits it anyway: the runbook's point)
    start_after: float = 0.0  # seconds after the simulator's start when the JobSet is created
    queued_seconds: float = 0.0  # seconds its Workload waits for quota (JobSet suspended, no pods)
    omit: list[str] = field(default_factory=list)  # JobSet object fields left out (OMITTABLE)

    @classmethod
    def from_dict(cls, d: dict, namespace: str = "default", rate: float = 1.0) -> JobSetSpec:
        d = dict(d)
        trainer = dict(d.pop("trainer", {}) or {})
        unknown = set(trainer) - TRAINER_KEYS
        if unknown:
            raise ValueError(f"unknown trainer keys {sorted(unknown)}")
        _check_numbers(trainer, "trainer")
        _check_numbers(d, "jobset")
        _check_strings(d)
        if "volumes" in d:
            d["volumes"] = normalize_volumes(d["volumes"])
        if "args" in d:
            d["args"] = normalize_args(d["args"])
        _check_trainer_types(trainer)
        d.setdefault("namespace", namespace)
        d.setdefault("rate", rate)
        known = {f for f in cls.__dataclass_fields__}
        bad = set(d) - known
        if bad:
            raise ValueError(f"unknown jobset keys {sorted(bad)}")
        trainer.setdefault("run_name", d.get("name", cls.name))
        return cls(trainer=trainer, **d)


@dataclass
class FaultSpec:
    action: str
    at: float | None = None  # seconds after start
    at_step: int | None = None  # right after the trainer wrote this step
    jobset: str | None = None
    params: dict = field(default_factory=dict)
    wait_for_reader: float | None = None  # this at_step fault's own faults_wait_for_reader

    @classmethod
    def from_dict(cls, d: dict) -> FaultSpec:
        if not isinstance(d, dict) or "action" not in d:
            raise ValueError(f"a fault needs an `action` (one of {sorted(ACTIONS)}), got {d!r}")
        d = dict(d)
        action = d.pop("action")
        if action not in ACTIONS:
            raise ValueError(f"unknown fault action {action!r} (one of {sorted(ACTIONS)})")
        at = d.pop("at", None)
        at_step = d.pop("at_step", None)
        if at is None and at_step is None:
            raise ValueError(f"fault {action!r} needs `at` (seconds) or `at_step`")
        jobset = d.pop("jobset", None)
        wait = d.pop("wait_for_reader", None)
        if wait is not None and (at_step is None or not isinstance(wait, (int, float))):
            raise ValueError(f"fault {action!r}: `wait_for_reader` is seconds, on an `at_step` fault")
        return cls(action, None if at is None else float(at), at_step, jobset, d,
                   None if wait is None else float(wait))


@dataclass
class Scenario:
    namespace: str = "default"
    seed: int = 0
    rate: float = 1.0
    log_max_size: int = 10 * 1024 * 1024  # kubelet containerLogMaxSize
    log_max_files: int = 5  # kubelet containerLogMaxFiles (current + rotated)
    grace_seconds: float = 30.0  # deletion grace period of pods replaced by a JobSet restart
    restart_pending_seconds: float = 2.0  # how long new pods stay Pending after a restart
    watch_timeout_seconds: float = 1800.0
    bookmark_seconds: float = 60.0  # a watch asking allowWatchBookmarks gets a BOOKMARK this often
    # > 0: an `at_step` fault waits, its trainer held, until a log response served the step's
    # lines (at most this many seconds). A test whose fault must strike a collector that is
    # reading live keeps that premise on a loaded machine; 0 (chaos, the default): never waits.
    faults_wait_for_reader: float = 0.0
    jobsets: list[JobSetSpec] = field(default_factory=list)
    faults: list[FaultSpec] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict) -> Scenario:
        d = dict(d or {})
        ns = d.get("namespace", "default")
        rate = float(d.get("rate", 1.0))
        js = [JobSetSpec.from_dict(x, ns, rate) for x in d.pop("jobsets", [{}])]
        faults = [FaultSpec.from_dict(x) for x in d.pop("faults", [])]
        if "log_max_size" in d:
            d["log_max_size"] = parse_size(d["log_max_size"])
        bad = set(d) - set(cls.__dataclass_fields__)
        if bad:
            raise ValueError(f"unknown scenario keys {sorted(bad)}")
        return cls(jobsets=js, faults=faults, **d)

    @classmethod
    def load(cls, path: str | Path) -> Scenario:
        text = Path(path).read_text()
        data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
        return cls.from_dict(data or {})
