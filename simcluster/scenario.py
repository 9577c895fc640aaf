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
    "rotate", "restart_jobset", "restart_container", "auth_lapse", "fail_next", "eof_streams",
    "stall", "set_rate", "deny", "corrupt_pods", "write_lines", "flood", "delete_pod",
    "stamp_skew", "clock_step", "db_outage", "db_restore", "slow_api", "hang_api", "watch_gone",
}


_INTEGERS = {"steps", "seed", "context_parallelism", "checkpoint_period", "slices", "hosts"}
_NUMBERS = {"replay_ce_offset", "step_seconds", "rate", "pending_seconds"}


def _check_numbers(d: dict, where: str) -> None:
    """Wrong-typed values fail here, at load, not in the running simulator."""
    for k in sorted(d.keys() & (_INTEGERS | _NUMBERS)):
        v = d[k]
        if isinstance(v, bool) or not isinstance(v, int if k in _INTEGERS else int | float):
            raise ValueError(f"{where} `{k}` must be {'an integer' if k in _INTEGERS else 'a number'}, got {v!r}")


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

    @classmethod
    def from_dict(cls, d: dict, namespace: str = "default", rate: float = 1.0) -> JobSetSpec:
        d = dict(d)
        trainer = dict(d.pop("trainer", {}) or {})
        unknown = set(trainer) - TRAINER_KEYS
        if unknown:
            raise ValueError(f"unknown trainer keys {sorted(unknown)}")
        _check_numbers(trainer, "trainer")
        _check_numbers(d, "jobset")
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
        return cls(action, None if at is None else float(at), at_step, jobset, d)


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
