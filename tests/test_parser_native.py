"""The C scan (parsers/_steady.c) against the Python scan it stands in for: whatever block the
C scan vouches for, the Python scan vouches for too and yields the same Steady fields."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from steptail.parsers import Malformed, format_ns, parse_line
from steptail.parsers import block as B
from steptail.parsers.bounds import CE_RAW_MAX, CLOCK_JUMP_NS, INT32_MAX, PROGRAM_MAX
from steptail.parsers.line import TAGS

native = B._native


def test_the_extension_is_built_and_knows_every_tag():
    assert native is not None, "parsers/_steady.c was not compiled (pip install -e . needs gcc)"
    assert native.TAGS == TAGS


def _nan_safe(x):
    if isinstance(x, float) and x != x:
        return "nan"
    if isinstance(x, (tuple, list)):
        return type(x)(_nan_safe(v) for v in x)
    return x


def same(block: bytes) -> bool:
    """True when the C scan took the block; asserts the Python scan gives the same fields."""
    out = native.steady(block, B._save_of)
    if out is None:
        return False
    ref = B._steady_py(block)
    assert ref is not None, block
    assert _nan_safe(tuple(B.Steady(*out))) == _nan_safe(tuple(ref)), block
    return True


def test_samples_agree_block_by_block(samples):
    taken = 0
    for path in sorted(samples.glob("*.log")):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            end = data.rfind(b"\n", pos, pos + 16_384) + 1 or len(data)
            taken += same(data[pos:end]) if data[end - 1 : end] == b"\n" else 0
            pos = end
    assert taken > 20


TS = "2026-11-30T04:00:1{s}.{f}Z "
LOSS = "I1130 04:00:11.726424 140233 train_sft.py:301] LOSS-PARTS step={n} ce={ce}{tail}"
RBF = "I1130 train.py:1333] REQUIRED_RBF step={n} max={mx} per_layer=[{layers}] program={prog}"
POD = ("metric_logger.py:210] completed step: {n}, seconds: {v}, TFLOP/s/device: 181.918, "
       "Tokens/s/device: 4016.205, total_weights: {w}, loss: {v}")

GOOD_NUM = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr).filter(lambda s: "inf" not in s),
    st.sampled_from(["0.012400", "1.234530e-04", "-0.5", "3E+2", "0", "-0", "1e400", "2.5e-320"]),
)
BAD_NUM = st.sampled_from(["05", "1.", "1e", "1_0", "+1", ".5", "0x1",
                           # what int()/float() read and no log prints (parsers.numbers)
                           "١٥", "١.0", "１５", "¹", "1²", "+0", "+inf", "NaN", "Infinity", "1\u00a0", "\u30001"])
GOOD_KEY = st.sampled_from(["z_loss", "moe_lb", "total", "weights", "Total", "_"])
BAD_KEY = st.sampled_from(["a1", "step", "ce", "x-y"])


@st.composite
def line(draw, n: int, ts: str, clean: bool) -> str:
    """One line at step n; `clean` lines are canonical (the C scan should take them)."""
    num = GOOD_NUM if clean else st.one_of(GOOD_NUM, BAD_NUM)
    key = GOOD_KEY if clean else st.one_of(GOOD_KEY, BAD_KEY)
    kinds = ["loss", "rbf", "pod", "save", "noise"] + ([] if clean else ["odd"])
    kind = draw(st.sampled_from(kinds))
    end = draw(st.sampled_from(["", "\r"] if clean else ["", "\r", " ", "\t", "\r\r"]))
    if kind == "loss":
        pairs = draw(st.lists(st.tuples(key, num), max_size=4, unique_by=lambda kv: kv[0]))
        tail = "".join(f" {k}={v}" for k, v in pairs) + (draw(st.sampled_from(["", " ", "\t "])) if pairs else "")
        ce = draw(st.one_of(num, st.sampled_from(["nan", "inf", "-inf"] + ([] if clean else ["nanx", "Inf"]))))
        body = LOSS.format(n=n, ce=ce, tail=tail)
    elif kind == "rbf":
        layer = st.floats(0, 2).map(lambda v: f"{v:.4f}") if clean else st.one_of(num, st.floats(0, 2).map(str))
        prog = st.sampled_from(["normal", "p.v-1", "_x"] + ([] if clean else ["9x", "REQUIRED_RBF"]))
        body = RBF.format(n=n, mx=draw(num), layers=",".join(draw(st.lists(layer, max_size=5))), prog=draw(prog))
    elif kind == "pod":
        body = POD.format(n=n, v=draw(num), w=draw(st.sampled_from(["1048576", "007"] + ([] if clean else ["x"]))))
    elif kind == "save":
        body = f"checkpointing.py:401] Saved a checkpoint at step {n}."
    elif kind == "noise":
        body = draw(st.sampled_from(["train step done", "\x1b[32mINFO\x1b[0m step", "Loaded batch"]))
    else:
        body = draw(st.sampled_from([
            "Config param x: 1", "Restoring checkpoint from step 5.", "LOSS-PARTS step=1 ce=1 REQUIRED_RBF",
            "\x1b[1mLOSS-PARTS step=3 ce=1.0", "Attempting to initialize the jax distributed system",
        ]))
    return ts + body + end


TIMES = ["2026-11-30T04:00:{s:02d}.{f:06d}Z ", "2024-02-29T23:59:{s:02d}Z ", "2200-12-31T23:59:{s:02d}.5Z ", ""]
ODD_TIMES = ["2201-01-01T00:00:00Z ", "2026-11-30T04:00:11.1234567890Z ", "2026-02-29T01:00:00Z ",
             "2026-11-30T24:00:00Z ", "2026-11-30T04:00:11.Z "]


@settings(max_examples=500)
@given(st.data(), st.integers(1, 40), st.booleans(), st.booleans(), st.booleans())
def test_random_blocks_agree(data, count, rising, clean, odd_time):
    if rising:
        steps = list(range(1, count + 1))
    else:
        steps = data.draw(st.lists(st.integers(0, 9), min_size=count, max_size=count))
    form = data.draw(st.sampled_from(TIMES))
    lines = []
    for i, n in enumerate(steps):
        ts = form.format(s=min(i // 3, 61), f=i)
        if odd_time and not clean and data.draw(st.booleans()):
            ts = data.draw(st.sampled_from(ODD_TIMES))
        lines.append(data.draw(line(n, ts, clean)))
    same("".join(ln + "\n" for ln in lines).encode())


def test_canonical_blocks_are_taken():
    lines = []
    for n in range(1, 200):
        ts = f"2026-11-30T04:{n // 60:02d}:{n % 60:02d}.{n:06d}Z "
        lines += [ts + LOSS.format(n=n, ce="3.781865", tail=" z_loss=1.279788e-04 weights=1048576"),
                  ts + POD.format(n=n, v="12.251", w="1048576"),
                  ts + RBF.format(n=n, mx="1.3958", layers="1.3958,1.1695", prog="normal")]
        if n % 50 == 0:
            lines.append(ts + f"checkpointing.py:401] Saved a checkpoint at step {n}.")
    block = "".join(ln + "\n" for ln in lines).encode()
    assert same(block)
    assert same(block.replace(b"\n", b"\r\n"))


@pytest.mark.parametrize("body, taken", [
    ("LOSS-PARTS step=1 ce=1.5", True),
    ("LOSS-PARTS step=1 ce=1.5 ", False),  # trailing blank without parts: not canonical
    ("LOSS-PARTS step=1 ce=1.5 a=1 ", True),
    ("LOSS-PARTS step=1 ce=05", False),
    ("LOSS-PARTS step=1 ce=nan total=-0", True),
    ("LOSS-PARTS step=1 ce=1.5 a=1 a=2", False),
    ("REQUIRED_RBF step=1 max=1.0 per_layer=[] program=p", True),
    ("REQUIRED_RBF step=1 max=1.0 per_layer=[1.0,02.0] program=p", False),
    ("completed step: 1, seconds: 1.0, TFLOP/s/device: 2, Tokens/s/device: 3, total_weights: 4, loss: 5", True),
])
def test_single_lines(body, taken):
    for ts in ("", "2026-11-30T04:00:11.5Z "):
        assert same((ts + body + "\n").encode()) is taken


# What a column cannot hold (parsers.bounds) neither scan takes: the reference parser reads the
# line alone and makes it a bad line.
@pytest.mark.parametrize("body, taken", [
    (f"LOSS-PARTS step={INT32_MAX} ce=1.5", True),
    (f"LOSS-PARTS step={INT32_MAX + 1} ce=1.5", False),
    ("LOSS-PARTS step=99999999999999999999 ce=1.5", False),
    ("LOSS-PARTS step=1 ce=0." + "0" * (CE_RAW_MAX - 2), True),
    ("LOSS-PARTS step=1 ce=0." + "0" * (CE_RAW_MAX - 1), False),
    ("LOSS-PARTS step=1 ce=" + "1" * 70, False),
    ("REQUIRED_RBF step=1 max=1.0 per_layer=[] program=" + "p" * PROGRAM_MAX, True),
    ("REQUIRED_RBF step=1 max=1.0 per_layer=[] program=" + "p" * (PROGRAM_MAX + 1), False),
    (f"REQUIRED_RBF step={INT32_MAX + 1} max=1.0 per_layer=[] program=p", False),
    (f"completed step: {INT32_MAX + 1}, seconds: 1.0, TFLOP/s/device: 2, Tokens/s/device: 3, total_weights: 4, "
     "loss: 5", False),
    ("Saved a checkpoint at step 99999999999.", False),
])
def test_values_the_columns_cannot_hold_are_not_taken(body, taken):
    for ts in ("", "2026-11-30T04:00:11.5Z "):
        line = (ts + body + "\n").encode()
        assert same(line) is taken, line
        if not taken:
            assert B._steady_py(line) is None
            assert isinstance(parse_line(line).record, Malformed)


T0 = 1_796_011_200 * 10**9  # 2026-11-30T04:00:00Z


@pytest.mark.parametrize("gap, taken", [(CLOCK_JUMP_NS, True), (CLOCK_JUMP_NS + 1, False)])
@pytest.mark.parametrize("second", ["LOSS-PARTS step=2 ce=1.5", "Saved a checkpoint at step 2."])
def test_a_clock_jump_inside_a_block_is_not_taken(gap, taken, second):
    block = f"{format_ns(T0)} LOSS-PARTS step=1 ce=1.5\n{format_ns(T0 + gap)} {second}\n".encode()
    assert same(block) is taken
    assert (B._steady_py(block) is not None) is taken


def test_a_save_stamped_beyond_int64_is_not_taken():
    block = f"{format_ns(T0)} LOSS-PARTS step=1 ce=1.5\n9999-12-31T23:59:59Z Saved a checkpoint at step 2.\n"
    assert not same(block.encode())
    assert B._steady_py(block.encode()) is None


@settings(max_examples=400)
@given(st.lists(st.tuples(st.integers(INT32_MAX - 3, INT32_MAX + 3), st.integers(CE_RAW_MAX - 3, CE_RAW_MAX + 3),
                          st.sampled_from([0, 1, CLOCK_JUMP_NS, CLOCK_JUMP_NS + 1])), min_size=1, max_size=5))
def test_values_near_the_bounds_agree(spec):
    t, lines = T0, []
    for step, width, gap in spec:
        t += gap
        lines.append(f"{format_ns(t)} LOSS-PARTS step={step} ce=1.{'1' * (width - 2)}\n")
    steps = [step for step, _, _ in spec]
    within = (all(step <= INT32_MAX and width <= CE_RAW_MAX for step, width, _ in spec)
              and all(gap <= CLOCK_JUMP_NS for _, _, gap in spec[1:])  # the first has no line before it
              and all(a < b for a, b in itertools.pairwise(steps)))
    assert same("".join(lines).encode()) is within


def test_a_callback_error_propagates():
    def boom(line):
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        native.steady(b"Saved a checkpoint at step 1.\n", boom)


PIECES = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([*TAGS, b"\n", b"\r", b" ", b"=", b"step=1", b" ce=", b"2026-11-30T04:00:11.5Z ", b"Z ",
                     b"per_layer=[", b"] program=", b"\x1b", b"1.5", b"-", b"e", b",", b"\x00"]),
)


@settings(max_examples=1500)
@given(st.lists(PIECES, max_size=60))
def test_arbitrary_bytes_never_crash_and_agree_when_taken(pieces):
    block = b"".join(pieces)
    for b in (block, block + b"\n"):
        same(b)


@st.composite
def decimal(draw) -> str:
    """Numbers as loggers print them: up to 17 significant digits, a point anywhere, an
    exponent or not (the C scan converts short ones exactly, others as float() does)."""
    digits = str(draw(st.integers(0, 10**draw(st.integers(1, 17)))))
    point = draw(st.integers(0, len(digits)))
    body = digits if point == len(digits) else f"{digits[:point] or '0'}.{digits[point:]}"
    exp = draw(st.one_of(st.just(""), st.integers(-330, 330).map(lambda e: f"e{e:+d}"),
                         st.integers(0, 40).map(lambda e: f"E{e}")))
    return draw(st.sampled_from(["", "-"])) + body + exp


@settings(max_examples=2000)
@given(decimal(), decimal())
def test_numbers_convert_exactly_as_float_does(ce, part):
    block = f"2026-11-30T04:00:11.5Z LOSS-PARTS step=1 ce={ce} z={part}\n".encode()
    assert same(block), block
    out = native.steady(block, B._save_of)
    assert repr(out[0][2][0]) == repr(float(ce))  # repr: the sign of a zero counts too
