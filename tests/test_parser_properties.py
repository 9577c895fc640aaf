"""Property tests: the parser never raises, and generated records round-trip."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from steptail.parsers import LossParts, Malformed, RequiredRbf, format_ns, parse_line, parse_rfc3339

KEYS = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True).filter(lambda k: k not in ("step", "ce"))
WORDS = st.from_regex(r"[a-z_][a-z_/]{0,10}", fullmatch=True).filter(
    lambda w: w.lower() not in ("nan", "inf", "infinity")
)
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
VALUES = st.one_of(st.integers(-(10**12), 10**12), FLOATS, WORDS)


def fmt(v) -> str:
    return repr(v) if isinstance(v, float) else str(v)


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return a == b and type(a) is type(b)


@given(st.binary(max_size=400))
@settings(max_examples=400)
def test_never_raises_on_bytes(raw):
    parse_line(raw)
    parse_line(b"LOSS-PARTS " + raw)
    parse_line(b"REQUIRED_RBF step=1 " + raw)
    parse_line(b"completed step: " + raw)


@given(
    step=st.integers(0, 10**9),
    ce=FLOATS,
    parts=st.dictionaries(KEYS, VALUES, max_size=6),
    ts=st.one_of(st.none(), st.integers(0, 4_000_000_000 * 10**9)),
    prefix=st.sampled_from(["", "I1130 04:09:24.123456 140233 train.py:812] ", "\x1b[32m"]),
    crlf=st.booleans(),
    data=st.data(),
)
def test_loss_parts_round_trip(step, ce, parts, ts, prefix, crlf, data):
    items = [("step", str(step)), ("ce", fmt(ce))] + [(k, fmt(v)) for k, v in parts.items()]
    items = data.draw(st.permutations(items))
    line = prefix + "LOSS-PARTS " + " ".join(f"{k}={v}" for k, v in items)
    if ts is not None:
        line = format_ns(ts) + " " + line
    parsed = parse_line(line.encode() + (b"\r\n" if crlf else b"\n"))
    rec = parsed.record
    assert isinstance(rec, LossParts)
    assert rec.step == step and same(rec.ce, ce) and rec.ce_raw == fmt(ce)
    assert rec.parts.keys() == parts.keys()
    assert all(same(rec.parts[k], v) for k, v in parts.items())
    assert parsed.ts_ns == ts


@given(
    step=st.integers(0, 10**9),
    mx=st.floats(allow_nan=False),
    layers=st.lists(st.floats(allow_nan=False), max_size=40),
    program=st.one_of(st.none(), WORDS),
)
def test_required_rbf_round_trip(step, mx, layers, program):
    line = f"REQUIRED_RBF step={step} max={mx!r} per_layer=[{','.join(map(repr, layers))}]"
    if program is not None:
        line += f" program={program}"
    assert parse_line(line.encode()).record == RequiredRbf.make(step, mx, layers, program)


# Digits of other scripts, full-width, superscripts, signs, underscores, non-ASCII blanks: int()
# and float() read most; the parser reads none (parsers.numbers), whatever field holds them.
NOT_ASCII_DIGITS = st.sampled_from([chr(z + d) for z in (0x0660, 0x06F0, 0x0966, 0x09E6, 0xFF10, 0x1D7CE)
                                    for d in (0, 1, 5, 9)] + list("⁰¹²⁵⁹"))
FORGIVEN = st.one_of(
    st.tuples(st.integers(0, 10**6).map(str), NOT_ASCII_DIGITS, st.integers(0, 6)).map(
        lambda t: t[0][: t[2]] + t[1] + t[0][t[2]:]),
    st.integers(0, 10**6).map(lambda n: f"+{n}"),
    st.integers(10, 10**6).map(lambda n: f"{str(n)[0]}_{str(n)[1:]}"),
    st.tuples(st.integers(0, 10**6).map(str), st.sampled_from(["\u00a0", "\u3000", "\u2003", "\x1c", "\x85"])).map(
        lambda t: t[0] + t[1] + "0"),
)


@given(FORGIVEN, st.sampled_from(["step", "ce"]), st.booleans())
def test_numbers_python_forgives_are_bad_lines(token, key, stamped):
    line = f"LOSS-PARTS step={token} ce=2.5" if key == "step" else f"LOSS-PARTS step=7 ce={token}"
    raw = (format_ns(10**18) + " " if stamped else "") + line
    rec = parse_line(raw.encode()).record
    assert isinstance(rec, Malformed), (raw, rec)


@given(FORGIVEN)
def test_a_forgiven_number_in_a_part_stays_a_word(token):
    rec = parse_line(f"LOSS-PARTS step=7 ce=2.5 lr={token}".encode()).record
    assert isinstance(rec, LossParts) and rec.parts == {"lr": token}


@given(st.integers(0, 4_000_000_000 * 10**9))
def test_timestamp_round_trip(ns):
    text = format_ns(ns)
    assert parse_rfc3339(text) == ns
    assert not text.endswith("0Z") or "." not in text  # trailing zeros of the fraction dropped
