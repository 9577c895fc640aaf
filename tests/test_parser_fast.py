"""The canonical-form fast path agrees with the general parser on every line it accepts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from steptail.parsers import Malformed, parse_line
from steptail.parsers.fast import as_record, parse_fast

SAMPLES = ["clean-300", "resume-gap", "resume-mismatch", "cp4-lb-nan", "resume-from-zero"]


def agree(line: bytes) -> bool:
    """True when the fast path took the line; asserts it matches the reference parser."""
    fast = parse_fast(line)
    if fast is None:
        return False
    ref = parse_line(line)
    assert (fast[1], as_record(fast)) == (ref.ts_ns, ref.record), line
    return True


def test_samples_take_the_fast_path_and_agree(samples):
    taken = 0
    for name in SAMPLES:
        for line in (samples / f"{name}.log").read_bytes().splitlines(keepends=True):
            taken += agree(line)
    assert taken > 4000  # nearly every per-step line is canonical


def test_fast_path_declines_what_it_cannot_judge():
    for line in (
        b"\x1b[32mLOSS-PARTS\x1b[0m step=1 ce=2.0",  # ANSI
        b"LOSS-PARTS ce=2.0 step=1",  # reordered
        b"LOSS-PARTS step=1 ce=2.0 mode=word",  # a word
        b"LOSS-PARTS step=1 ce=2.0 z=1 z=2",  # repeated key
        b"LOSS-PARTS step=1 ce=2.0 ce=3.0",
        b"LOSS-PARTS step=1 ce=2.0 total=nan",
        b"LOSS-PARTS step=1 ce=2.",  # not a JSON number
        b"2026-11-30T25:00:00Z LOSS-PARTS step=1 ce=2.0",  # hour 25
        b"2026-02-30T01:00:00Z LOSS-PARTS step=1 ce=2.0",  # no such day
        b"2026-11-30T01:00:00+01:00 LOSS-PARTS step=1 ce=2.0",  # offset
        b"LOSS-PARTSX LOSS-PARTS step=1 ce=2.0",  # first tag is not the record
        b"REQUIRED_RBF step=1 max=1.0 per_layer=[1,2] program=p",  # ints
        b"REQUIRED_RBF step=1 max=1_0 per_layer=[1.0] program=p",
        b"REQUIRED_RBF step=1 max=1.0 per_layer=[1.0, 2.0] program=p",
        b"completed step: 1, seconds: 1.0",
    ):
        assert parse_fast(line) is None, line


NUM = st.one_of(
    st.integers(-(10**9), 10**9).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr).filter(lambda s: "inf" not in s),
    st.sampled_from(["0.012400", "1.234530e-04", "-0.5", "3E+2", "0", "1048576"]),
)


@given(
    ts=st.sampled_from(["", "2026-11-30T04:00:11.72698Z ", "2026-11-30T04:00:11Z ", "1999-01-01T00:00:00.000000001Z "]),
    prefix=st.sampled_from(["", "I1130 04:09:24.123456 140233 train.py:812] ", "x "]),
    step=st.integers(0, 10**7),
    ce=st.one_of(NUM, st.sampled_from(["nan", "inf", "-inf"])),
    parts=st.lists(st.tuples(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), NUM), max_size=6),
    end=st.sampled_from(["", "\n", "\r\n", "  \n"]),
)
def test_loss_parts_agree(ts, prefix, step, ce, parts, end):
    tail = "".join(f" {k}={v}" for k, v in parts)
    agree(f"{ts}{prefix}LOSS-PARTS step={step} ce={ce}{tail}{end}".encode())


# Numbers int()/float() read and no log prints (parsers.numbers): neither path takes them.
UNICODE_DIGITS = [0x0660, 0x06F0, 0x0966, 0xFF10, 0x1D7CE]


@st.composite
def python_only(draw) -> str:
    digits = str(draw(st.integers(0, 10**6)))
    how = draw(st.sampled_from(["script", "plus", "underscore", "superscript", "space"]))
    if how == "script":
        zero = draw(st.sampled_from(UNICODE_DIGITS))
        return "".join(chr(zero + int(c)) for c in digits)
    if how == "plus":
        return "+" + digits
    if how == "underscore":
        return digits[:1] + "_" + digits[1:] + "0"
    if how == "superscript":
        return digits + "²"
    return draw(st.sampled_from(["\u00a0", "\u3000", "\u2003"])) + digits


@given(python_only(), st.sampled_from(["step", "ce", "part", "max", "layer", "pod step", "seconds", "weights"]),
       st.sampled_from(["", "2026-11-30T04:00:11.72698Z "]))
def test_numbers_only_python_reads_are_refused_by_both(token, field, ts):
    line = {
        "step": f"LOSS-PARTS step={token} ce=1.5",
        "ce": f"LOSS-PARTS step=1 ce={token}",
        "part": f"LOSS-PARTS step=1 ce=1.5 z={token}",
        "max": f"REQUIRED_RBF step=1 max={token} per_layer=[1.0] program=p",
        "layer": f"REQUIRED_RBF step=1 max=1.0 per_layer=[1.0,{token}] program=p",
        "pod step": f"completed step: {token}, seconds: 1.0, total_weights: 1, loss: 1.0",
        "seconds": f"completed step: 1, seconds: {token}, total_weights: 1, loss: 1.0",
        "weights": f"completed step: 1, seconds: 1.0, total_weights: {token}, loss: 1.0",
    }[field]
    raw = (ts + line + "\n").encode()
    assert not agree(raw)
    rec = parse_line(raw).record
    if field == "part":  # a part is a number by the grammar or the word it is
        assert rec.parts["z"] == token
    else:
        assert isinstance(rec, Malformed), (line, rec)


@given(
    step=st.integers(0, 10**7),
    layers=st.lists(st.floats(0, 100, allow_nan=False).map(lambda v: f"{v:.4f}"), max_size=20),
    mx=st.floats(0, 100).map(lambda v: f"{v:.4f}"),
)
def test_rbf_and_pod_agree(step, layers, mx):
    agree(f"REQUIRED_RBF step={step} max={mx} per_layer=[{','.join(layers)}] program=normal\n".encode())
    agree(
        f"completed step: {step}, seconds: 12.251, TFLOP/s/device: 181.918, Tokens/s/device: "
        f"4016.205, total_weights: 1048576, loss: {mx}\n".encode()
    )


# -- whole blocks: the steady-state path gives the run model exactly what line by line gives --
from unittest.mock import patch  # noqa: E402

from steptail.collector.offline.ingest import apply_parsed  # noqa: E402
from steptail.parsers import block as block_module  # noqa: E402
from steptail.parsers.block import MIN_PART, line_by_line, parse_block  # noqa: E402
from steptail.runs.model import RunModel  # noqa: E402

CANONICAL = [
    b"2026-11-30T04:00:1%dZ I1130 04:00:11.726424 140233 train_sft.py:301] LOSS-PARTS step=%d ce=3.781865 z_loss=1.279788e-04 weights=1048576",
    b"2026-11-30T04:00:1%dZ I1130 04:00:11.726981 140233 metric_logger.py:210] completed step: %d, seconds: 12.251, TFLOP/s/device: 181.918, Tokens/s/device: 4016.205, total_weights: 1048576, loss: 5.191",
    b"2026-11-30T04:00:1%dZ I1130 04:00:11.728095 140233 train.py:1333] REQUIRED_RBF step=%d max=1.3958 per_layer=[1.3958,1.1695] program=normal",
    b"2026-11-30T04:00:1%dZ I1130 04:00:11.728095 140233 x.py:1] noise without a tag %d",
    b"2026-11-30T04:00:1%dZ \x1b[32mINFO\x1b[0m tunix.sft.peft_trainer: train step done %d",
    b"2026-11-30T04:00:1%dZ I1130 checkpointing.py:401] Saved a checkpoint at step %d.",
    b"LOSS-PARTS step=%d%d ce=2.5",
]
ODD = [
    b"\x1b[32mLOSS-PARTS\x1b[0m step=%d%d ce=2.0",
    b"LOSS-PARTS step=%d%d ce=2.0 mode=word",
    b"REQUIRED_RBF step=%d%d max=1 per_layer=[1,2] program=p",
    b"completed step: %d%d, seconds: 1.0",
    b"Config param x%d: LOSS-PARTS step=%d ce=1.0",
    b"LOSS-PARTS step=%d%d ce=1.0 REQUIRED_RBF step=1 max=1.0 per_layer=[] program=p",
    b"2026-11-30T04:00:1%dZ Attempting to initialize the jax distributed system... %d",
    b"Restoring checkpoint from step %d%d.",
    b"garbage \xff\xfe LOSS-PARTS step=%d%d ce=1.0",
]


def _nan_free(rows):
    return [tuple("nan" if isinstance(v, float) and v != v else v for v in r) for r in rows]


def _state(model: RunModel):
    batch = model.take()
    for table in ("loss_parts", "required_rbf", "pod_metrics"):
        setattr(batch, table, _nan_free(getattr(batch, table)))
    cursors = {k: (c.hwm_ns, sorted(c.at_hwm)) for k, c in model.cursors.items()}
    counters = model.counters
    return (batch.loss_parts, batch.required_rbf, batch.pod_metrics, batch.checkpoints, batch.config,
            batch.incarnations, cursors, counters.loss_parts, counters.required_rbf,
            counters.pod_steps, counters.duplicates, counters.bad_lines)


def _both(blocks, prefix=()) -> tuple[int, tuple, tuple]:
    ref, fast = RunModel("r"), RunModel("r")
    for line in prefix:
        ref.feed(line)
        fast.feed(line)
    steady = 0
    taken: list[bool] = []  # what feed_steady answered, call by call
    feed = fast.feed_steady
    fast.feed_steady = lambda body, *stream: taken.append(feed(body, *stream)) or taken[-1]
    for block in blocks:
        ref.feed_items(line_by_line(block))
        parsed, before = parse_block(block), len(taken)
        apply_parsed(fast, parsed, lambda a, b, blk=block: blk[a:b])
        steady += parsed[0] == "C" and all(taken[before:])
    return steady, _state(ref), _state(fast)


def _blocks(data: bytes, size: int) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        end = data.rfind(b"\n", pos, pos + size) + 1 or len(data)
        out.append(data[pos:end])
        pos = end
    return out


def test_block_paths_agree_on_samples(samples):
    steady = 0
    for name in SAMPLES:
        n, ref, fast = _both(_blocks((samples / f"{name}.log").read_bytes(), 20_000))
        assert fast == ref, name
        steady += n
    assert steady > 50  # the steady state is taken whole


@given(
    st.lists(st.tuples(st.booleans(), st.integers(0, 8), st.integers(0, 9), st.integers(0, 30)),
             max_size=60),
    st.integers(1, 6),
    st.booleans(),
    st.booleans(),
    st.sampled_from([MIN_PART, 16, 64, 256]),
)
def test_block_paths_agree_on_mixed_lines(spec, nblocks, primed, ordered, min_part):
    if ordered:  # mostly rising time and steps: the shape of a healthy log, steady blocks likely
        spec = sorted(spec, key=lambda t: (t[2], t[3]))
    lines = []
    for canon, k, sec, step in spec:
        table = CANONICAL if canon else ODD
        lines.append(table[k % len(table)] % (sec, step))
    data = b"".join(line + b"\n" for line in lines)
    prefix = [b"2026-11-30T04:00:00Z Attempting to initialize the jax distributed system...",
              b"2026-11-30T04:00:05Z LOSS-PARTS step=3 ce=1.0"] if primed else []
    with patch.object(block_module, "MIN_PART", min_part):  # small: refused blocks are cut in parts
        _, ref, fast = _both(_blocks(data, max(1, len(data) // nblocks)), prefix)
    assert fast == ref


def test_a_refused_block_is_cut_and_only_the_odd_part_goes_line_by_line():
    lines, steps = [], [*range(1, 1501), *range(1001, 2501)]  # a restart replays from 1000
    for t, n in enumerate(steps, start=1):
        ts = b"2026-11-30T%02d:%02d:%02d.000001Z " % (t // 3600, t // 60 % 60, t % 60)
        if n == 1001 and t > 1500:
            lines += [ts + b"Attempting to initialize the jax distributed system...",
                      ts + b"Restoring checkpoint from step 1000."]
        lines += [ts + CANONICAL[0].split(b"Z ", 1)[1] % n, ts + CANONICAL[2].split(b"Z ", 1)[1] % n]
    block = b"".join(line + b"\n" for line in lines)
    assert len(block) > 2 * MIN_PART
    kind, parts = parse_block(block)
    assert kind == "M"

    def leaves(parsed):
        return [leaf for _, _, p in parsed[1] for leaf in leaves(p)] if parsed[0] == "M" else [parsed[0]]

    kinds = leaves((kind, parts))
    assert kinds.count("I") == 1 and kinds.count("C") > 10
    _, ref, fast = _both([block], [b"2026-11-30T00:00:00Z Attempting to initialize the jax distributed system..."])
    assert fast == ref
    assert [(r[1], r[2]) for r in ref[0]] == [(1, n) for n in range(1, 1501)] + [(2, n) for n in range(1001, 2501)]


def test_templates_never_hide_a_leading_zero():
    """A line shaped like a known template but with a leading zero (valid for the general
    parser, not JSON) must not slip through the per-shape template."""
    good = b"2026-11-30T04:00:1%dZ I1 train_sft.py:301] LOSS-PARTS step=%d ce=%s z=%s"
    lines = [good % (0, 1, b"15.5", b"11.25"), good % (1, 2, b"05.5", b"11.25"),
             good % (2, 3, b"15.5", b"01.25")]
    block = b"".join(line + b"\n" for line in lines)
    n, ref, fast = _both([block])
    assert n == 0 and fast == ref
    assert [r[5] for r in ref[0]] == ["15.5", "05.5", "15.5"]
