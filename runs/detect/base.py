"""What a plug-in detector is given and answers (runs/detect/__init__.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from steptail.parsers.numbers import parse_integer
from steptail.runs.findings import Finding
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
    saved: int | None = None  # highest checkpoint saved
    saves: set[int] = field(default_factory=set)  # steps that saved a checkpoint
    closed: bool = False  # a later incarnation began
    first_read: int | None = None  # first step of a head not read, when the load-balance rule could not run


class Engine(Protocol):
    """What a detector may use of the engine that runs it."""

    run: str
    settings: Any  # runs.detect.Settings: each plug-in reads the knobs its module declares
    reference_ce: dict[int, float]
    findings: dict[tuple, Finding]  # every finding so far, by key

    def emit(self, kind: str, inc: int, first: int, last: int, detail: str, severity: str,
             now_ns: int | None = None) -> Finding | None: ...

    def changed(self, f: Finding) -> None: ...  # a finding handed out before, changed

    # one more step of a range finding (opened when not adjacent); note(f.extra) keeps the
    # detector's state on it, describe(f) writes its detail
    def grow(self, kind: str, inc: int, step: int, severity: str, describe: Callable[[Finding], str],
             note: Callable[[dict], None] | None = None) -> None: ...

    def incarnations(self) -> dict[int, IncView]: ...

    @property
    def max_step(self) -> int | None: ...  # the highest step recorded so far

    @property
    def cp(self) -> int | None: ...  # the latest ici_context_parallelism seen

    @property
    def step1_seen(self) -> bool: ...

    @property
    def current(self) -> int: ...  # the newest incarnation's number (0: none yet)

    @property
    def arrival_ns(self) -> int | None: ...  # the engine's clock when the latest step was observed


def take_nothing() -> None:
    """Nothing to do when the engine takes a steady run of steps."""


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

    def step(self, inc: IncView, step: int, ts: int | None) -> None:
        """A new LOSS-PARTS step of `inc` after its first, in log order (inc.last_step and
        inc.last_ts: the step before; a gap between them is already judged)."""

    def loss(self, inc: IncView, step: int, ce: float | None, raw: str) -> None:
        """A new LOSS-PARTS step of `inc` (its first too), after the gap and stall rules
        (ce None: not finite; raw: the token the log printed)."""

    def recorded(self, inc: IncView, step: int) -> None:
        """A new LOSS-PARTS step of `inc` (its first too), once the step's own rules judged it
        (inc.last_step: still the step before)."""

    def steady(self, inc: IncView, steps: list[int], stamps: list[int | None],
               ces: list[float | None]) -> Callable[[], None] | None:
        """The bulk path: consecutive new steps of `inc` (not step 1, none recorded before)
        that the engine would take at once. None: one of them needs this
        detector row by row (step); else what to do when the engine takes them, which must
        leave the state step() would have and find nothing."""
        return take_nothing

    def after_losses(self, inc: IncView, rows: dict[str, list]) -> None:
        """A batch's rows of `inc` by table, once its LOSS-PARTS rows were judged."""

    def closed(self, inc: IncView) -> None:
        """A later incarnation began: `inc` logs nothing more."""

    def alone_first(self, left: int) -> int:
        """How many of `left` rows to judge one by one before the bulk path is tried again."""
        return 0

    def tick(self, now_ns: int, running: bool, heard_ns: int | None, heard_stamp_ns: int | None) -> None:
        """Live, from the clock: the follower reads the stream (`running`) and knows nothing
        was held back up to `heard_ns` (wall time) or its latest line's stamp (heard_stamp_ns)."""

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
