"""What a plug-in detector is given and answers (runs/detect/__init__.py)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from steptail.parsers.numbers import parse_integer
from steptail.runs.findings import Finding, Settings
from steptail.runs.gaps import StepGap

CP_PARAM = "ici_context_parallelism"
LB_PARAM = "context_parallel_load_balance"


@dataclass
class IncView:
    """One incarnation as the engine tracks it (the detectors read it; the engine writes it)."""

    number: int
    saw_start: bool = False
    restored_from: int | None = None
    config: dict[str, str] = field(default_factory=dict)
    lb_checked: bool = False
    last_step: int | None = None
    last_ts: int | None = None
    last_rbf: int | None = None
    saved: int | None = None  # highest checkpoint saved
    saves: set[int] = field(default_factory=set)  # steps that saved a checkpoint
    rbf_steps: set[int] = field(default_factory=set)
    pending_rbf: deque[int] = field(default_factory=deque)  # LOSS-PARTS steps awaiting REQUIRED_RBF
    closed: bool = False
    first_read: int | None = None  # first step of a head not read, when the load-balance rule could not run


class Engine(Protocol):
    """What a detector may use of the engine that runs it."""

    run: str
    settings: Settings
    reference_ce: dict[int, float]
    findings: dict[tuple, Finding]  # every finding so far, by key

    def emit(self, kind: str, inc: int, first: int, last: int, detail: str, severity: str,
             now_ns: int | None = None) -> Finding | None: ...

    def changed(self, f: Finding) -> None: ...  # a finding handed out before, changed

    def incarnations(self) -> dict[int, IncView]: ...

    @property
    def max_step(self) -> int | None: ...  # the highest step recorded so far

    @property
    def cp(self) -> int | None: ...  # the latest ici_context_parallelism seen

    @property
    def step1_seen(self) -> bool: ...


class Detector:
    """A rule over a run; every hook is optional. Hooks are called in log order, per
    incarnation, with what the engine knows up to that row."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def config(self, inc: IncView, name: str, value: str) -> None:
        """A `Config param` line of `inc` (already in inc.config)."""

    def rows(self, inc: IncView, rows: dict[str, list]) -> None:
        """A batch's rows of `inc` by table, before its LOSS-PARTS rows are judged one by one."""

    def first_step(self, inc: IncView, step: int) -> None:
        """`inc`'s first LOSS-PARTS step (the engine's max_step: its predecessors')."""

    def unread_head(self, inc: IncView, gap: StepGap, step: int, head: str) -> None:
        """`inc`'s log was read from `step` on, its start-up unread: the rules whose input was
        in that head say they could not run. `head`: that said in words."""

    def step_one(self, inc: IncView, ce: float | None, raw: str) -> None:
        """Step 1's LOSS-PARTS (ce None: not finite)."""

    def cluster(self, f: Finding) -> bool:
        """A finding read off the cluster's objects: True when this detector took it."""
        return False

    def remember(self, stored: list[Finding]) -> None:
        """The run's stored findings, before its rows are replayed."""

    def finish(self) -> None:
        """End of the data."""


def truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("true", "1", "yes", "on")


def as_int(value: str | None) -> int | None:
    """A config value as the log's number grammar reads it (int() takes `٤`, `+4`, `1_0`)."""
    return None if value is None else parse_integer(str(value).strip())


def fmt_ce(ce: float | None, raw: str | None = None) -> str:
    return raw if ce is None else f"{ce:.6f}"


def context_parallelism(engine: Engine, inc: IncView) -> int | None:
    """The incarnation's ici_context_parallelism, else the run's latest."""
    cp = as_int(inc.config.get(CP_PARAM))
    return engine.cp if cp is None else cp
