"""Typed records parsed from one log line. Plain data, no behaviour beyond decoding.

Loss parts and per-layer factors are carried as JSON text: that is the form both sinks
store, and rendering it once in the parser keeps the hot path free of per-row encoding.
JSON has no nan/inf, so non-finite values are the words "nan", "inf", "-inf" there; the
`parts` / `per_layer` properties turn them back into floats."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import orjson


class ItemKind:
    """First field of a fast-path item (parsers.fast.parse_fast, parsers.block.line_by_line).
    Plain one-letter str, not an Enum: items are pickled between processes and compared in
    the ingest loop by the million."""

    LOSS = "L"  # LOSS-PARTS
    RBF = "R"  # REQUIRED_RBF
    POD = "P"  # completed step
    GENERAL = "X"  # any other tagged line: the general parser reads it


class BlockKind:
    """First field of a parsers.block.parse_block result."""

    STEADY = "C"  # a Steady block, every line canonical
    LINES = "I"  # items, line by line
    SPLIT = "M"  # parts, each a parse_block result


# A value of a LOSS-PARTS key: int, float (nan/inf allowed) or a bare word.
PartValue = int | float | str
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def to_json(value) -> str:
    """JSON text of a dict or list of parsed values, non-finite floats as words."""
    if isinstance(value, dict):
        value = {k: _safe(v) for k, v in value.items()}
    else:
        value = [_safe(v) for v in value]
    return orjson.dumps(value).decode()


def _safe(v):
    return str(v) if isinstance(v, float) and not math.isfinite(v) else v


def _restore(v):
    return _NONFINITE.get(v, v) if isinstance(v, str) else v


@dataclass(slots=True, frozen=True, eq=False)
class LossParts:
    step: int
    ce: float  # may be nan/inf; `ce_raw` keeps the token as printed
    ce_raw: str
    parts_json: str = "{}"  # every key but step and ce, as a JSON object

    @classmethod
    def make(cls, step: int, ce: float, ce_raw: str, parts: dict[str, PartValue]) -> LossParts:
        return cls(step, ce, ce_raw, to_json(parts))

    @property
    def parts(self) -> dict[str, PartValue]:
        return {k: _restore(v) for k, v in orjson.loads(self.parts_json).items()}

    def __eq__(self, other) -> bool:
        if not isinstance(other, LossParts):
            return NotImplemented
        return (self.step, self.ce_raw, orjson.loads(self.parts_json)) == (
            other.step, other.ce_raw, orjson.loads(other.parts_json))

    __hash__ = None


@dataclass(slots=True, frozen=True, eq=False)
class RequiredRbf:
    step: int
    max: float
    per_layer_json: str  # JSON array of floats
    program: str | None

    @classmethod
    def make(cls, step: int, mx: float, per_layer, program: str | None) -> RequiredRbf:
        return cls(step, mx, to_json(list(per_layer)), program)

    @property
    def per_layer(self) -> tuple[float, ...]:
        return tuple(float(_restore(v)) for v in orjson.loads(self.per_layer_json))

    def __eq__(self, other) -> bool:
        if not isinstance(other, RequiredRbf):
            return NotImplemented
        return (self.step, self.max, self.per_layer, self.program) == (
            other.step, other.max, other.per_layer, other.program)

    __hash__ = None


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
