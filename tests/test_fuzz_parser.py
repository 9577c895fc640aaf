"""The line parser fuzzed with hypothesis (issue 34): byte strings, free or shaped like the
tagged lines, into every entry point (parse_line, parse_fast, parse_block, candidate_lines,
split_timestamp). Never an exception; the fast path agrees with the general parser whenever it
takes a line; a record's fields have their types. Sized to cost seconds (deadline off: timing
is not the property)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steptail.parsers import (
    LossParts,
    Malformed,
    ParsedLine,
    RequiredRbf,
    candidate_lines,
    parse_line,
    split_timestamp,
)
from steptail.parsers.block import parse_block
from steptail.parsers.fast import as_record, parse_fast

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Pieces real lines are made of, so the generator reaches the parsers' inner branches.
PIECES = [b"LOSS-PARTS", b"REQUIRED_RBF", b"completed step:", b"step=", b"ce=", b"z_loss=", b"max=",
          b"per_layer=[", b"]", b"program=", b" ", b"=", b"1", b"-0", b"1e-05", b"nan", b"inf", b"-inf",
          b"0x1f", b"\xd9\xa1", b"\x1b[32m", b"\x1b[0m", b"\r", b"\n", b"\x00", b"\xff\xfe", b"\xe2\x80\xae",
          b"2026-11-30T04:00:01Z ", b"2026-11-30T04:00:01.123456789+01:00 ", b"I1130 train.py:1] ", b",",
          b"seconds:", b"9" * 30, b"1.5", b"+1", b"."]
shaped = st.lists(st.sampled_from(PIECES) | st.binary(max_size=8), max_size=40).map(b"".join)
lines = st.binary(max_size=400) | shaped


def check_line(raw: bytes) -> None:
    parsed = parse_line(raw)
    assert isinstance(parsed, ParsedLine)
    rec = parsed.record
    if isinstance(rec, LossParts):
        assert isinstance(rec.step, int) and isinstance(rec.ce, float)
    elif isinstance(rec, RequiredRbf):
        assert isinstance(rec.step, int) and all(isinstance(v, float) for v in rec.per_layer)
    elif isinstance(rec, Malformed):
        assert isinstance(rec.reason, str)
    fast = parse_fast(raw)
    if fast is not None:  # the fast path takes only what it reads exactly as the general parser
        assert (fast[1], as_record(fast)) == (parsed.ts_ns, rec), raw


@FUZZ
@given(lines)
def test_any_line_parses_without_an_exception(raw):
    check_line(raw)
    split_timestamp(raw)


@FUZZ
@given(st.lists(lines, max_size=30))
def test_any_block_parses_without_an_exception(parts):
    block = b"\n".join(parts) + b"\n"
    kind, _ = parse_block(block)
    assert kind is not None
    for line in candidate_lines(block):
        check_line(line)
