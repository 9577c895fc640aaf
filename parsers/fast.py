"""Fast path for the three per-step lines in their canonical form.

Nine lines in ten that carry a record are LOSS-PARTS, REQUIRED_RBF or `completed step`
exactly as MaxText prints them. For those, one anchored regex at the tag (found with
bytes.find) and JSON text built by substitution (its validity cached per digit-folded
shape) replace decoding, tokenising and encoding. Anything else (ANSI codes, reordered keys, words, nan parts, odd
timestamps, malformed input) returns None and goes to the general parser in line.py,
which is the reference: both give equal records (tests/test_parser_fast.py)."""

from __future__ import annotations

import calendar
import datetime
import re

from steptail.parsers.bounds import CE_RAW_MAX, INT32_MAX, INT64_MAX, PROGRAM_MAX
from steptail.parsers.numbers import CANONICAL, CANONICAL_POINT, NONFINITE, UNSIGNED, as_bytes
from steptail.parsers.records import ItemKind, LossParts, PodStep, RequiredRbf
from steptail.parsers.timestamps import split_timestamp

# Numbers: parsers.numbers' canonical subset (a JSON number), steps and weights unsigned.
_NUM = as_bytes(CANONICAL)
_STEP = b"(" + as_bytes(UNSIGNED) + b")"
_TS = re.compile(rb"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})")
# Record bodies from their tag to the end of the line.
_NONFINITE = b"|".join(as_bytes(word) for word in NONFINITE)
_LOSS_BODY = rb"LOSS-PARTS step=" + _STEP + rb" ce=(" + _NUM + b"|" + _NONFINITE + rb")( [^\r\n]*)?\r?"
_RBF_BODY = (
    rb"REQUIRED_RBF step=" + _STEP + rb" max=(" + _NUM + rb") per_layer=\[([^\]\s]*)\]"
    rb" program=([A-Za-z_][A-Za-z0-9_.-]*)[ \t]*\r?"
)
_POD_BODY = (
    rb"completed step: " + _STEP + rb", seconds: (" + _NUM + rb"), TFLOP/s/device: (" + _NUM
    + rb"), Tokens/s/device: (" + _NUM + rb"), total_weights: " + _STEP + rb", loss: (" + _NUM
    + rb")[ \t]*\r?"
)
LOSS_LINE, RBF_LINE, POD_LINE = (re.compile(b + rb"\n?\Z") for b in (_LOSS_BODY, _RBF_BODY, _POD_BODY))
_DAYS: dict[bytes, int] = {}  # b"YYYY-MM-DD" -> epoch seconds at 00:00 UTC
_MINUTES: dict[bytes, int] = {}  # b"THH:MM:" -> seconds into the day
_RECENT: dict[bytes, int] = {}  # b"YYYY-MM-DDTHH:MM:SS" -> ns, for the last few seconds seen
_SCALE = [10 ** (9 - k) for k in range(10)]  # fraction digits -> ns multiplier
# Validity of a LOSS-PARTS tail or a layer list depends only on its shape once leading
# zeros are ruled out: every digit folded to 1 keeps the other JSON-number rules (points,
# signs, exponents), so one check serves each shape and the caches stay small.
_FOLD = bytes.maketrans(b"0123456789", b"1111111111")
# For the leading-zero test: nonzero digits become 1 and commas `=`, so that a number with a
# leading zero is `=0` + digit (or `=-0` + digit), whatever separates it from the previous.
_ZEROS = bytes.maketrans(b"123456789,", b"111111111=")


def _leading_zero(text: bytes) -> bool:
    """What folding hides: a number with a leading zero (`007`, `-01.5`), which JSON forbids.
    Numbers start after `=` (a tail) or `,` (a layer list), or at the very start."""
    z = b"=" + text.translate(_ZEROS)
    return b"=00" in z or b"=01" in z or b"=-00" in z or b"=-01" in z


_SHAPES: dict[bytes, bool] = {}
_LAYER_SHAPES: dict[bytes, bool] = {}
# Comma-separated decimal floats (a point in each, as the general parser's floats render).
_DEC = as_bytes(CANONICAL_POINT)
_DECIMALS = re.compile(rb"(?:" + _DEC + rb",)*" + _DEC)
_KEY_VALUE = re.compile(rb"(?: [A-Za-z_][A-Za-z0-9_]*=" + _NUM + rb")+")


def line_ts(line: bytes) -> int | None:
    """A line's kubelet timestamp in ns since the epoch (None without one), read once for all
    its readers (the follower's checks, the cursor, the parsers): ts_of when it vouches, else
    the reference (parsers.timestamps). The two differ only on seconds 60 and 61, which ts_of
    and the C scan read and kubelet never prints."""
    ts = ts_of(line)
    return split_timestamp(line.rstrip(b"\r\n"))[0] if ts is False else ts


def ts_of(line: bytes) -> int | None | bool:
    """ns since epoch, None without a timestamp, False when the general parser must judge."""
    if not line[:1].isdigit():
        return None
    z = line.find(b"Z ", 19, 31)
    if z < 0:
        return False
    head = line[:19]
    base = _RECENT.get(head)  # lines of one step share their second
    if base is None:
        # Day and hour:minute from caches (a log spans few of either); seconds here.
        day, minute, sec = _DAYS.get(line[:10]), _MINUTES.get(line[10:17]), line[17:19]
        if day is None or minute is None or not sec.isdigit() or int(sec) > 61:
            whole = _seconds(head)
            if whole is None:
                return False
        else:
            whole = day + minute + int(sec)
        if len(_RECENT) > 64:
            _RECENT.clear()
        base = _RECENT[head] = whole * 1_000_000_000
    if z == 19:
        return base
    frac = line[20:z]
    if line[19] != 46 or not frac.isdigit() or len(frac) > 9:  # 46: "."
        return False
    return base + int(frac) * _SCALE[len(frac)]


def _seconds(whole: bytes) -> int | None:
    """Validate `YYYY-MM-DDTHH:MM:SS` the slow way and remember its day and minute."""
    m = _TS.fullmatch(whole)
    if m is None:
        return None
    y, mo, d, h, mi, s = map(int, m.groups())
    if not 1970 <= y <= 2200:  # as the C scan: the general parser judges the rest
        return None
    try:
        datetime.date(y, mo, d)
    except ValueError:
        return None
    if h > 23 or mi > 59 or s > 61:
        return None
    if len(_DAYS) > 10_000:
        _DAYS.clear()
    _DAYS[whole[:10]] = calendar.timegm((y, mo, d, 0, 0, 0))
    _MINUTES[whole[10:17]] = h * 3600 + mi * 60
    return _DAYS[whole[:10]] + h * 3600 + mi * 60 + s


def _valid_shape(text: bytes, cache: dict[bytes, bool], check) -> bool:
    """check(folded text), remembered per digit-folded shape (leading zeros checked apart)."""
    shape = text.translate(_FOLD)
    ok = cache.get(shape)
    if ok is None:
        ok = check(shape)
        if len(cache) < 4096:
            cache[shape] = ok
    return ok


def _shape_ok(shape: bytes) -> bool:
    if not _KEY_VALUE.fullmatch(shape):
        return False
    keys = [t.partition(b"=")[0] for t in shape.split()]
    # Folded keys may collide (a2/a3): such a tail goes to the general parser, to be safe.
    return len(set(keys)) == len(keys) and b"step" not in keys and b"ce" not in keys


def _lz(number: bytes) -> bool:
    """A leading zero (`05`, `-05`): JSON forbids it. The regexes reject it; a line parsed by
    digit-folded template (parsers.block) is checked here."""
    return number[:1] == b"0" and number[1:2].isdigit() or number[:2] == b"-0" and number[2:3].isdigit()


# Row builders: groups -> a row, checking what depends on the values (the timestamp, leading
# zeros, what the columns hold: parsers.bounds). The *_item builders add the checks that depend
# only on a line's shape, and the kind in front; parsers.block runs those once per shape, then
# rows alone. A row is (ts_ns, step, the record's fields); an item is (kind, *row), and in
# parsers.block's lists the line after it.
ROW_TS, ROW_STEP = 0, 1
ITEM_KIND, ITEM_TS, ITEM_STEP, ITEM_LINE = 0, 1, 2, -1


def loss_row(ts, step: bytes, ce_raw: bytes, tail: bytes | None) -> tuple | None:
    tail = tail.rstrip(b" \t") if tail else tail
    if ts is False or _lz(ce_raw) or (tail and _leading_zero(tail)):
        return None
    step = int(step)
    if step > INT32_MAX or len(ce_raw) > CE_RAW_MAX:
        return None
    parts = '{"' + tail[1:].replace(b"=", b'":').replace(b" ", b',"').decode() + "}" if tail else "{}"
    ce = ce_raw.decode()
    return ts, step, float(ce), ce, parts


def rbf_row(ts, step: bytes, mx: bytes, layers: bytes, program: bytes) -> tuple | None:
    if ts is False or _lz(mx) or _leading_zero(layers):
        return None
    step = int(step)
    if step > INT32_MAX or len(program) > PROGRAM_MAX:
        return None
    return ts, step, float(mx), "[" + layers.decode() + "]", program.decode()


def pod_row(ts, g: tuple) -> tuple | None:
    if ts is False or _lz(g[1]) or _lz(g[2]) or _lz(g[3]) or _lz(g[5]):
        return None
    step, weights = int(g[0]), int(g[4])
    if step > INT32_MAX or weights > INT64_MAX:
        return None
    return ts, step, float(g[1]), float(g[2]), float(g[3]), weights, float(g[5])


def loss_item(ts, step: bytes, ce_raw: bytes, tail: bytes | None) -> tuple | None:
    if tail and not _valid_shape(tail.rstrip(b" \t"), _SHAPES, _shape_ok):
        return None
    row = loss_row(ts, step, ce_raw, tail)
    return None if row is None else (ItemKind.LOSS, *row)


def rbf_item(ts, step: bytes, mx: bytes, layers: bytes, program: bytes) -> tuple | None:
    ok = _valid_shape(layers, _LAYER_SHAPES, lambda shape: not shape or _DECIMALS.fullmatch(shape) is not None)
    row = rbf_row(ts, step, mx, layers, program) if ok else None
    return None if row is None else (ItemKind.RBF, *row)


def pod_item(ts, g: tuple) -> tuple | None:
    row = pod_row(ts, g)
    return None if row is None else (ItemKind.POD, *row)


def parse_fast(line: bytes) -> tuple | None:
    """A canonical per-step line as a plain tuple (cheap to pickle between processes), else None:

    (ItemKind.LOSS, ts_ns, step, ce, ce_raw, parts_json)             LOSS-PARTS
    (ItemKind.RBF, ts_ns, step, max, per_layer_json, program)        REQUIRED_RBF
    (ItemKind.POD, ts_ns, step, seconds, tflops, tokens_per_s, total_weights, loss)   completed step
    """
    return parse_stamped(line, ts_of(line))


def parse_stamped(line: bytes, ts: int | None | bool) -> tuple | None:
    """parse_fast for a line whose timestamp was read already: by ts_of (False: not vouched
    for, the line goes to the general parser) or by line_ts."""
    if b"\x1b" in line:
        return None
    if (i := line.find(b"LOSS-PARTS")) >= 0:
        m = LOSS_LINE.match(line, i)
        return None if m is None else loss_item(ts, *m.groups())
    if (i := line.find(b"REQUIRED_RBF")) >= 0:
        m = RBF_LINE.match(line, i)
        return None if m is None else rbf_item(ts, *m.groups())
    if (i := line.find(b"completed step:")) >= 0:
        m = POD_LINE.match(line, i)
        return None if m is None else pod_item(ts, m.groups())
    return None


def as_record(item: tuple) -> LossParts | RequiredRbf | PodStep:
    """The record a fast-path tuple stands for (for tests and general consumers)."""
    kind, _, *f = item
    if kind == ItemKind.LOSS:
        return LossParts(*f)
    if kind == ItemKind.RBF:
        return RequiredRbf(*f)
    return PodStep(*f)
