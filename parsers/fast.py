"""Fast path for the three per-step lines in their canonical form (one regex each, on bytes).

Nine lines in ten that carry a record are LOSS-PARTS, REQUIRED_RBF or `completed step`
exactly as MaxText prints them. Matching that form whole lets the parser skip decoding,
tokenising and JSON encoding. Anything else (ANSI codes, reordered keys, words, nan,
odd timestamps, malformed input) returns None and goes to the general parser in line.py,
which is the reference: both give equal records (tests/test_parser_fast.py)."""

from __future__ import annotations

import calendar
import datetime
import re

from parsers.records import LossParts, PodStep, RequiredRbf

_NUM = rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"  # a JSON number
_DEC = rb"-?(?:0|[1-9][0-9]*)\.[0-9]+(?:[eE][+-]?[0-9]+)?"  # a JSON number with a point
_TS = rb"(?:([0-9]{4}-[0-9]{2}-[0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?Z )?"
_PREFIX = rb"[^\x1b\r\n]*?"
_END = rb"[ \t]*\r?\n?\Z"

_LOSS = re.compile(
    _TS + _PREFIX + rb"(LOSS-PARTS) step=([0-9]+) ce=(" + _NUM + rb"|nan|inf|-inf)"
    rb"((?: [A-Za-z_][A-Za-z0-9_]*=" + _NUM + rb")*)" + _END
)
_RBF = re.compile(
    _TS + _PREFIX + rb"(REQUIRED_RBF) step=([0-9]+) max=(" + _DEC + rb")"
    rb" per_layer=\[((?:" + _DEC + rb",)*" + _DEC + rb")?\] program=([A-Za-z_][A-Za-z0-9_.-]*)" + _END
)
_POD = re.compile(
    _TS + _PREFIX + rb"(completed step:) ([0-9]+), seconds: (" + _NUM + rb"), TFLOP/s/device: ("
    + _NUM + rb"), Tokens/s/device: (" + _NUM + rb"), total_weights: ([0-9]+), loss: ("
    + _NUM + rb")" + _END
)
_KEYS = re.compile(rb" ([A-Za-z_][A-Za-z0-9_]*)=")
_DAYS: dict[bytes, int] = {}
_LAYOUTS: dict[bytes, bool] = {}  # key layout of a LOSS-PARTS tail -> keys are unique


def _ts(m: re.Match) -> int | None | bool:
    """ns since epoch, None without a timestamp, False when the general parser must judge."""
    day = m.group(1)
    if day is None:  # a line opening with a digit may carry a timestamp of another form
        return False if m.string[:1].isdigit() else None
    secs = _DAYS.get(day)
    if secs is None:
        y, mo, d = int(day[:4]), int(day[5:7]), int(day[8:10])
        try:
            datetime.date(y, mo, d)
        except ValueError:
            return False
        secs = _DAYS[day] = calendar.timegm((y, mo, d, 0, 0, 0))
    h, mi, s = int(m.group(2)), int(m.group(3)), int(m.group(4))
    if h > 23 or mi > 59 or s > 61:
        return False
    frac = m.group(5)
    ns = (secs + h * 3600 + mi * 60 + s) * 1_000_000_000
    return ns + int(frac.ljust(9, b"0")) if frac else ns


def _first_tag(line: bytes, m: re.Match) -> bool:
    return line.find(m.group(6)) == m.start(6)


def parse_fast(line: bytes) -> tuple | None:
    """A canonical per-step line as a plain tuple (cheap to pickle between processes), else None:

    ("L", ts_ns, step, ce, ce_raw, parts_json)             LOSS-PARTS
    ("R", ts_ns, step, max, per_layer_json, program)       REQUIRED_RBF
    ("P", ts_ns, step, seconds, tflops, tokens_per_s, total_weights, loss)   completed step
    """
    if b"LOSS-PARTS" in line:
        m = _LOSS.match(line)
        if m is None or not _first_tag(line, m):
            return None
        tail = m.group(9)
        if tail:
            layout = b" ".join(_KEYS.findall(tail))
            ok = _LAYOUTS.get(layout)
            if ok is None:
                keys = layout.split()
                ok = len(set(keys)) == len(keys) and b"step" not in keys and b"ce" not in keys
                if len(_LAYOUTS) < 1024:
                    _LAYOUTS[layout] = ok
            if not ok:
                return None
            parts = '{"' + tail[1:].replace(b"=", b'":').replace(b" ", b',"').decode() + "}"
        else:
            parts = "{}"
        ts = _ts(m)
        if ts is False:
            return None
        ce_raw = m.group(8).decode()
        return "L", ts, int(m.group(7)), float(ce_raw), ce_raw, parts
    if b"REQUIRED_RBF" in line:
        m = _RBF.match(line)
        if m is None or not _first_tag(line, m):
            return None
        ts = _ts(m)
        if ts is False:
            return None
        layers = m.group(9)
        per_layer = "[" + layers.decode() + "]" if layers else "[]"
        return "R", ts, int(m.group(7)), float(m.group(8)), per_layer, m.group(10).decode()
    if b"completed step:" in line:
        m = _POD.match(line)
        if m is None or not _first_tag(line, m):
            return None
        ts = _ts(m)
        if ts is False:
            return None
        g = m.groups()
        return "P", ts, int(g[6]), float(g[7]), float(g[8]), float(g[9]), int(g[10]), float(g[11])
    return None


def as_record(item: tuple) -> LossParts | RequiredRbf | PodStep:
    """The record a fast-path tuple stands for (for tests and general consumers)."""
    kind, _, *f = item
    if kind == "L":
        return LossParts(*f)
    if kind == "R":
        return RequiredRbf(*f)
    return PodStep(*f)
