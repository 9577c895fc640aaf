"""What a finding is, how severe each kind is, and the knobs of the detectors (docs/verdicts.md).

Severity: "critical" when the run's result can no longer be trusted or a runbook rule is broken
(CE gate failure, non-finite CE, resume mismatch, load-balance rule, resume from zero); "warning"
when records are missing or in doubt (gap, head gap, unread tail, missing REQUIRED_RBF, stall, a
step or clock jump read in a line, a step-1 gate that could not run for want of its reference or
of step 1, a step time regression of 1.5x to 5x — critical from 5x); "info" when noted with nothing to do (a rule not evaluable for want of its input, e.g.
the load-balance rule when the config lines were never read). The collector's own faults (auth,
stream, Parquet failures) are not findings: see COLLECTOR_FAULTS."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from steptail.parsers import format_ns

CRITICAL = "critical"
WARNING = "warning"
INFO = "info"  # noted, nothing to do: e.g. a rule that could not be evaluated for want of its input
SEVERITIES = (CRITICAL, WARNING, INFO)  # most severe first
# `check` exits 1 when the run has a finding of one of these (info alone: exit 0).
ACTIONABLE = frozenset({CRITICAL, WARNING})


def actionable(findings) -> bool:
    """Whether any of `findings` asks the user to act (`check`'s exit 1)."""
    return any(f.severity in ACTIONABLE for f in findings)

# The kinds of finding, each named once here (the code compares with these, never a literal).
GAP, HEAD_GAP = "gap", "head_gap"
# The load-balance rule: the runbook's rule `load_balance`, seen in the config lines (the
# detectors) or in the JobSet's args (follow): one kind, one finding citing both.
STALL, NONFINITE_CE, STEP1_CE_GATE, LOAD_BALANCE_RULE = "stall", "nonfinite_ce", "step1_ce_gate", "rule:load_balance"
RESUME_FROM_ZERO, RESUME_MISMATCH, MISSING_RBF = "resume_from_zero", "resume_mismatch", "missing_rbf"
STREAM_FAILURE, AUTH_FAILURE, PARQUET_FAILURE = "stream_failure", "auth_failure", "parquet_failure"
STEP_JUMP, CLOCK_JUMP, UNREAD_TAIL = "step_jump", "clock_jump", "unread_tail"
# Process 0's log mostly unreadable over a window (binary output, an unknown encoding): the
# run's own output, so its data is in doubt (warning), unlike the collector's faults.
UNREADABLE_LOG = "unreadable_log"
# An incarnation's median step time >= 1.5x the previous incarnation's (runs/step_time.py).
STEP_TIME_REGRESSION = "step_time_regression"
KINDS = (
    GAP, HEAD_GAP, STALL, NONFINITE_CE, STEP1_CE_GATE, LOAD_BALANCE_RULE,
    RESUME_FROM_ZERO, RESUME_MISMATCH, MISSING_RBF, STEP_JUMP, CLOCK_JUMP, UNREAD_TAIL, UNREADABLE_LOG,
    STEP_TIME_REGRESSION,
)
# The collector's own faults: collector events (health: steptail.collector.notify.collector_events),
# never findings of a run. A fault that lost steps is named as the cause on the run's gap
# finding; the lost tail of a deleted pod's log stays a finding (unread_tail). Stores written
# before this hold them as findings: read and shown as stored.
COLLECTOR_FAULTS = (AUTH_FAILURE, STREAM_FAILURE, PARQUET_FAILURE)
# The collector's own finding (run ""): a name from the cluster refused as unsafe, never a run.
UNSAFE_NAME = "unsafe_name"
# A runbook rule (runs/runbook.yaml) the live JobSet or its pods break: kind "rule:<name>".
# Rules are data, so their kinds are not listed here; `rule_kind` names them.
RULE_PREFIX = "rule:"
# A failed JobSet deleted before its pod logs were saved (`follow --archive`, `archive`).
LOGS_NOT_SAVED = "logs_not_saved"
# Kinds that only the live follower can see (the clock, the stream, the cluster's objects):
# `check` keeps the stored ones instead of recomputing them.
LIVE_KINDS = frozenset({STALL, STREAM_FAILURE, AUTH_FAILURE, PARQUET_FAILURE, UNREAD_TAIL, UNREADABLE_LOG,
                        LOGS_NOT_SAVED})
LIVE_KIND_PATTERN = RULE_PREFIX + "%"  # SQL LIKE: the rule kinds, live too


def rule_kind(rule: str) -> str:
    return RULE_PREFIX + rule


def is_live_kind(kind: str) -> bool:
    """Only `follow` can raise it: `check` keeps the stored ones. Not the load-balance rule:
    the config lines raise it again (its JobSet evidence is kept: FindingEngine.remember)."""
    return kind in LIVE_KINDS or (kind.startswith(RULE_PREFIX) and kind != LOAD_BALANCE_RULE)
NO_STEP = -1  # first/last_step of a finding not tied to a step
NO_INCARNATION = 0


def knob(default: float, flag: str, help: str):
    """A detector setting a command can change: its one default, its option and help, declared
    in the detector's module (runs/detect; the commands' options are made from these:
    steptail/commands/_detect_options.py)."""
    return field(default=default, metadata={"flag": flag, "help": help})


def knobs(settings_class) -> list:
    """The settings a command's options set (dataclasses.Field, with flag and help)."""
    return [f for f in fields(settings_class) if "flag" in f.metadata]


@dataclass
class Finding:
    kind: str
    run: str
    incarnation: int
    first_step: int
    last_step: int
    detail: str
    severity: str
    detected_ns: int
    extra: dict = field(default_factory=dict, compare=False, repr=False)  # detector state

    @property
    def key(self) -> tuple[str, str, int, int]:
        """The identity stored once (uq_findings): a range that grows keeps its key."""
        return (self.run, self.kind, self.incarnation, self.first_step)

    @property
    def detected_at(self) -> str:
        return format_ns(self.detected_ns)

    @property
    def steps(self) -> str:
        if self.first_step == NO_STEP:
            return ""
        return step_range(self.first_step, self.last_step)

    def to_dict(self) -> dict:
        """The fields of `check --json`."""
        return {
            "kind": self.kind, "incarnation": self.incarnation, "first_step": self.first_step,
            "last_step": self.last_step, "detail": self.detail, "severity": self.severity,
        }

    def to_event(self) -> dict:
        """The payload of a log line or a webhook: everything, with a readable time."""
        return {"run": self.run, **self.to_dict(), "detected_at": self.detected_at}


def step_range(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}\u2013{last}"


def sort_key(f: Finding) -> tuple:
    return (f.incarnation, f.first_step, f.kind)


def finding_id(f: Finding) -> str:
    """Stable id of a finding (its key as text), so a webhook receiver can drop a retry whose
    first POST did arrive; the alert outbox stores deliveries under it."""
    return f"{f.run}/{f.kind}/{f.incarnation}/{f.first_step}"
