"""`key=value` tokens: ints, floats (decimal, scientific, nan, inf, -inf) and bare words."""

from __future__ import annotations

import re

from steptail.parsers.records import PartValue

_INT = re.compile(r"[+-]?\d+\Z")
_FLOAT = re.compile(
    r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|nan|inf|infinity)\Z", re.I
)


def parse_value(token: str) -> PartValue:
    if _INT.match(token):
        return int(token)
    if _FLOAT.match(token):
        return float(token)
    return token


def parse_float(token: str) -> float | None:
    """A float from a decimal, scientific or non-finite token; None if it is not one."""
    return float(token) if _FLOAT.match(token) else None


def parse_int(token: str) -> int | None:
    return int(token) if _INT.match(token) else None
