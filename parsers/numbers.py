"""The number grammar at the parser's edge: numbers as loggers print them, ASCII only.

Python's int() and float() read far more than a log writes: Unicode digits (`١٥` is 15),
full-width and other decimal digits, a leading `+`, `-0` for a step, underscores (`1_000`),
surrounding whitespace, `Infinity`, `NaN`. A line whose numeric field is any of those is
not a record (the parser makes it Malformed: counted, sampled), never misread as one.

One definition for every path: the general parser (parsers.line, through parsers.values)
matches these patterns, the fast path and block scan (parsers.fast, parsers.block) compile
the same text as bytes patterns, and the C scan (parsers/_steady.c: uint_, num) is held to
them by tests/test_number_grammar.py, which calls its scanners directly.

Per field:
- UNSIGNED: steps (step=0 is legal: MaxText's RBF probe prints it), total_weights, process
  index and count. Decimal digits only: no sign, no `-0`.
- INTEGER: an integer-looking LOSS-PARTS part; a leading `-` only.
- FLOAT: ce, max, per-layer factors, the per-pod measurements. Decimal or scientific with an
  optional leading `-` (repr, `%g`, `%e` never print a `+` before the mantissa, but do in the
  exponent: `1e+03`), or `nan`, `inf`, `-inf` as Python and numpy print them.
- CANONICAL: the subset the fast path and the C scan take (a JSON number: no leading zero,
  digits on both sides of a point); anything else in FLOAT goes to the general parser.
"""

from __future__ import annotations

import re

UNSIGNED = r"[0-9]+"
INTEGER = r"-?[0-9]+"
_EXPONENT = r"(?:[eE][+-]?[0-9]+)?"
DECIMAL = r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)" + _EXPONENT
NONFINITE = ("nan", "inf", "-inf")
FLOAT = DECIMAL + "|" + "|".join(NONFINITE)
CANONICAL = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?" + _EXPONENT
CANONICAL_POINT = r"-?(?:0|[1-9][0-9]*)\.[0-9]+" + _EXPONENT  # per-layer factors: always a point

_UNSIGNED, _INTEGER, _FLOAT = (re.compile(f"(?:{p})") for p in (UNSIGNED, INTEGER, FLOAT))
# Below int()'s limit on digits (4300: beyond it int() raises, and a raise must not leave a
# parser); no column holds an integer of more than 19 digits anyway.
MAX_INT_DIGITS = 4000


def parse_unsigned(token: str) -> int | None:
    """A step, count or index; None unless ASCII decimal digits only."""
    return int(token) if len(token) <= MAX_INT_DIGITS and _UNSIGNED.fullmatch(token) else None


def parse_integer(token: str) -> int | None:
    return int(token) if len(token) <= MAX_INT_DIGITS and _INTEGER.fullmatch(token) else None


def parse_number(token: str) -> int | float | None:
    """An integer if the token is one (None if too long to convert: never read as a float),
    else a float, else None."""
    if _INTEGER.fullmatch(token):
        return int(token) if len(token) <= MAX_INT_DIGITS else None
    return parse_float(token)


def parse_float(token: str) -> float | None:
    """A float from a decimal, scientific or non-finite token; None if it is not one."""
    return float(token) if _FLOAT.fullmatch(token) else None


def as_bytes(pattern: str) -> bytes:
    """A pattern above for a bytes regex (the fast path reads lines undecoded)."""
    return pattern.encode("ascii")
