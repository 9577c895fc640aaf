"""`key=value` tokens: ints, floats (parsers.numbers' grammar) and bare words."""

from __future__ import annotations

from steptail.parsers.numbers import parse_float, parse_integer, parse_number, parse_unsigned
from steptail.parsers.records import PartValue

__all__ = ["parse_float", "parse_integer", "parse_unsigned", "parse_value"]


def parse_value(token: str) -> PartValue:
    """A LOSS-PARTS part or an extra per-pod field: a number by the grammar, else the word as
    printed (`+1`, `١٥`, `1_000` stay words: kept, never read as a number)."""
    number = parse_number(token)
    return token if number is None else number
