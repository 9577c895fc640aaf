"""Typed records parsed from one log line. Plain data, no behaviour."""

from __future__ import annotations

from dataclasses import dataclass, field

# A value of a LOSS-PARTS key: int, float (nan/inf allowed) or a bare word.
PartValue = int | float | str


@dataclass(slots=True, frozen=True)
class LossParts:
    step: int
    ce: float  # may be nan/inf; `ce_raw` keeps the token as printed
    ce_raw: str
    parts: dict[str, PartValue] = field(default_factory=dict)  # every key but step and ce


@dataclass(slots=True, frozen=True)
class RequiredRbf:
    step: int
    max: float
    per_layer: tuple[float, ...]
    program: str | None


@dataclass(slots=True, frozen=True)
class PodStep:
    """MaxText's per-pod `completed step` line: throughput only, never the loss of record."""

    step: int
    seconds: float | None = None
    tflops: float | None = None
    tokens_per_s: float | None = None
    total_weights: int | None = None
    loss: float | None = None
    extra: dict[str, PartValue] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class ConfigParam:
    name: str
    value: str


@dataclass(slots=True, frozen=True)
class Checkpoint:
    kind: str  # "restore" | "save"
    step: int


@dataclass(slots=True, frozen=True)
class TrainerStart:
    """The trainer (re)starting: `Attempting to initialize…` or `…initialized! process_index=…`."""

    process_index: int | None = None
    process_count: int | None = None


@dataclass(slots=True, frozen=True)
class Malformed:
    """A line that carries a record tag but could not be read as that record."""

    tag: str
    reason: str
    text: str


Record = LossParts | RequiredRbf | PodStep | ConfigParam | Checkpoint | TrainerStart


@dataclass(slots=True, frozen=True)
class ParsedLine:
    ts_ns: int | None  # kubelet timestamp, ns since the epoch
    ts: str | None  # the timestamp as printed (RFC3339Nano)
    record: Record | Malformed | None
