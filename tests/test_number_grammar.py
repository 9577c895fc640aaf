"""Numbers as logs write them, not as Python reads them (issue 20, item 4).

`step=١٥` (Arabic-Indic digits), `step=+151`, `step=-0`, `ce=١.0`, `1_000`, full-width and
superscript digits: int() and float() take most of them, parsers.numbers takes none. One
grammar for the general parser, the fast path, the Python block scan and the C scan; a line
whose numeric field it refuses is Malformed (counted, sampled), never a record, on both parse
paths (ingest's blocks, RunModel.feed) and both stores."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_follow_support import assert_exactly_once, follow_sim, scenario
from test_follow_support import findings as follow_findings
from test_follow_support import rows as follow_rows
from test_poison_lines import (
    STEPS,
    T0,
    all_good,
    follow_lines,
    good_log,
    ingest_file,
    recorded,
    stamp,
    write,
)

from steptail.parsers import (
    Checkpoint,
    LossParts,
    Malformed,
    PodStep,
    RequiredRbf,
    TrainerStart,
    parse_line,
)
from steptail.parsers import block as B
from steptail.parsers import numbers as N
from steptail.parsers.fast import parse_fast
from steptail.runs.model import RunModel
from steptail.storage.findings import check_run, sync_findings

native = B._native

# -- the grammar itself ------------------------------------------------------------------------
STEPS_OK = ["0", "15", "007", "2147483647"]
STEPS_REFUSED = ["١٥", "+151", "-0", "-1", "1_000", " 15", "15 ", "１５", "¹⁵", "۱۵", "१५", "15.0", "1e3", "",
                 "0x1f", "\u200b15", "15\u00a0"]
FLOATS_OK = {"1.0": 1.0, "-0": -0.0, "-0.0": -0.0, "1e+03": 1000.0, "1E-3": 0.001, "3.781865": 3.781865,
             ".5": 0.5, "5.": 5.0, "1e400": float("inf"), "inf": float("inf"), "-inf": float("-inf"), "42": 42.0}
FLOATS_REFUSED = ["١.0", "+1.0", "+inf", "Infinity", "NaN", "INF", "-nan", "+nan", "1_000.5", " 1.0", "1.0 ",
                  "１.０", "²", "1.0e", "e5", ".", "-", "0x1p3", "1,5", "٫5", "1.5\u3000"]


@pytest.mark.parametrize("token", STEPS_OK)
def test_steps_are_unsigned_ascii_decimals(token):
    assert N.parse_unsigned(token) == int(token)
    if native is not None:
        assert native.unsigned(token.encode()) == int(token)


@pytest.mark.parametrize("token", STEPS_REFUSED)
def test_steps_python_would_read_are_refused(token):
    assert N.parse_unsigned(token) is None
    if native is not None:
        assert native.unsigned(token.encode()) is None


@pytest.mark.parametrize("token", FLOATS_OK)
def test_floats_as_loggers_print_them(token):
    want = FLOATS_OK[token]
    got = N.parse_float(token)
    assert got == want and repr(got) == repr(want)  # repr: -0.0 stays negative


@pytest.mark.parametrize("token", FLOATS_REFUSED)
def test_floats_python_would_read_are_refused(token):
    assert N.parse_float(token) is None
    if native is not None:
        assert native.number(token.encode(), False) is None


def test_python_reads_what_the_grammar_refuses():
    """Why the grammar exists: each of these is a number to Python."""
    assert int("١٥") == 15 and int("+151") == 151 and int("-0") == 0 and int("1_000") == 1000
    assert int(" 15 ") == 15 and int("１５") == 15 and float("١.0") == 1.0 and float("Infinity") == float("inf")


# -- hypothesis: Python-readable numbers that no log prints -------------------------------------------
# Decimal digits of other scripts (each a contiguous 0-9 run), superscripts (isdigit, not decimal).
SCRIPTS = [0x0660, 0x06F0, 0x0966, 0x09E6, 0x0E50, 0xFF10, 0x1D7CE, 0x1D7F6, 0x104A0]
SUPERSCRIPTS = "⁰¹²³⁴⁵⁶⁷⁸⁹"
UNICODE_SPACE = ["\u00a0", "\u2003", "\u3000", "\u205f", "\x85", "\x1c", "\u2028", "\u200b", "\ufeff"]


@st.composite
def hostile(draw, base: str) -> str:
    """`base` (an ASCII number) changed the way int()/float() forgive and loggers never write."""
    how = draw(st.sampled_from(["script", "superscript", "plus", "underscore", "space"]))
    digits = [i for i, c in enumerate(base) if c.isdigit()]
    if how == "script":
        zero = draw(st.sampled_from(SCRIPTS))
        at = draw(st.lists(st.sampled_from(digits), min_size=1, unique=True))
        return "".join(chr(zero + int(c)) if i in at else c for i, c in enumerate(base))
    if how == "superscript":
        i = draw(st.sampled_from(digits))
        return base[:i] + SUPERSCRIPTS[int(base[i])] + base[i + 1 :]
    if how == "plus":
        return "+" + base.removeprefix("-")
    if how == "underscore":
        pairs = [i for i in digits if i + 1 < len(base) and base[i + 1].isdigit()]
        if not pairs:
            return base + "_0"
        i = draw(st.sampled_from(pairs))
        return base[: i + 1] + "_" + base[i + 1 :]
    space = draw(st.sampled_from(UNICODE_SPACE))
    return draw(st.sampled_from([space + base, base + space, base[:1] + space + base[1:]]))


ASCII_STEP = st.integers(0, 10**6).map(str)
ASCII_FLOAT = st.one_of(st.floats(allow_nan=False, allow_infinity=False).map(repr),
                        st.floats(0, 100).map(lambda v: f"{v:.4f}"))


def _refused_everywhere(line: str) -> None:
    """The line is Malformed for the reference parser and taken by no faster path."""
    raw = ("2026-11-30T04:00:11.5Z " + line + "\n").encode()
    rec = parse_line(raw).record
    assert isinstance(rec, Malformed), (line, rec)
    assert parse_fast(raw) is None
    assert B._steady_py(raw) is None
    if native is not None:
        assert native.steady(raw, B._save_of) is None
    assert B.line_by_line(raw)[0][0] == "X"  # the block path hands it to the general parser too


GOOD_RBF = "per_layer=[1.3958,1.1695] program=normal"
POD = ("completed step: {step}, seconds: {s}, TFLOP/s/device: {f}, Tokens/s/device: 4016.205, "
       "total_weights: {w}, loss: {loss}")
FIELDS = {  # where a number sits in each kind of line: a template with one hole
    "loss step": "LOSS-PARTS step={} ce=3.781865 z_loss=1.2e-04",
    "loss ce": "LOSS-PARTS step=15 ce={} weights=1048576",
    "rbf step": "REQUIRED_RBF step={} max=1.3958 " + GOOD_RBF,
    "rbf max": "REQUIRED_RBF step=15 max={} " + GOOD_RBF,
    "rbf layer": "REQUIRED_RBF step=15 max=1.3958 per_layer=[1.3958,{}] program=normal",
    "pod step": POD.format(step="{}", s="12.251", f="181.918", w="1048576", loss="5.191"),
    "pod seconds": POD.format(step="15", s="{}", f="181.918", w="1048576", loss="5.191"),
    "pod tflops": POD.format(step="15", s="12.251", f="{}", w="1048576", loss="5.191"),
    "pod weights": POD.format(step="15", s="12.251", f="181.918", w="{}", loss="5.191"),
    "pod loss": POD.format(step="15", s="12.251", f="181.918", w="1048576", loss="{}"),
    "save step": "checkpointing.py:401] Saved a checkpoint at step {}.",
    "restore step": "checkpointing.py:401] Restoring checkpoint from step {}.",
    "process index": "Jax distributed system initialized! process_index={} process_count=32",
    "process count": "Jax distributed system initialized! process_index=0 process_count={}",
}
UNSIGNED_FIELDS = {"loss step", "rbf step", "pod step", "pod weights", "save step", "restore step",
                   "process index", "process count"}


@settings(max_examples=300)
@given(st.data(), st.sampled_from(sorted(FIELDS)))
def test_hostile_numbers_in_every_field_are_malformed_on_every_path(data, field):
    base = data.draw(ASCII_STEP if field in UNSIGNED_FIELDS else ASCII_FLOAT)
    token = data.draw(hostile(base))
    if field == "rbf layer" and "," in token:
        return
    _refused_everywhere(FIELDS[field].format(token))


@settings(max_examples=200)
@given(st.sampled_from(sorted(FIELDS)), st.data())
def test_the_same_fields_in_ascii_are_records(field, data):
    base = data.draw(ASCII_STEP if field in UNSIGNED_FIELDS else ASCII_FLOAT)
    rec = parse_line(FIELDS[field].format(base).encode()).record
    assert isinstance(rec, LossParts | RequiredRbf | PodStep | Checkpoint | TrainerStart), (field, base, rec)


@given(st.sampled_from(["step", "ce"]), st.sampled_from(["-0", "+0", "+151", "١٥", "-1"]))
def test_the_issue_s_own_examples(key, token):
    line = f"LOSS-PARTS step={token} ce=1.0" if key == "step" else f"LOSS-PARTS step=15 ce={token}"
    rec = parse_line(line.encode()).record
    if key == "ce" and token in ("-0", "-1"):
        assert isinstance(rec, LossParts) and rec.ce_raw == token
    else:
        _refused_everywhere(line)


def test_a_part_python_would_read_is_kept_as_the_word_it_is():
    rec = parse_line("LOSS-PARTS step=15 ce=1.0 lr=١.0 w=+1 n=1_000 z=-0 e=1e+03".encode()).record
    assert isinstance(rec, LossParts)
    assert rec.parts == {"lr": "١.0", "w": "+1", "n": "1_000", "z": 0, "e": 1000.0}
    assert isinstance(rec.parts["z"], int)


# -- agreement: whatever any path accepts, the grammar accepts, with Python's value ----------------------
_UNSIGNED = re.compile(N.UNSIGNED)
_CANONICAL = re.compile(N.CANONICAL)
_CANONICAL_POINT = re.compile(N.CANONICAL_POINT)
TOKENS = st.one_of(
    st.text(max_size=12),
    st.text(alphabet="0123456789+-._eE ١٥１²\u00a0", max_size=12),
    ASCII_FLOAT, ASCII_STEP, ASCII_FLOAT.flatmap(hostile), ASCII_STEP.flatmap(hostile),
)


@settings(max_examples=1500)
@given(TOKENS)
def test_every_scanner_accepts_only_the_grammar(token):
    i, f = N.parse_unsigned(token), N.parse_float(token)
    assert i is None or (token.isascii() and _UNSIGNED.fullmatch(token) and i == int(token))
    assert f is None or (token.isascii() and repr(f) == repr(float(token)))
    if native is None:
        return
    raw = token.encode("utf-8", "surrogatepass")
    c_int = native.unsigned(raw)
    assert c_int is None or (_UNSIGNED.fullmatch(token) and c_int == i)
    for point, rx in ((False, _CANONICAL), (True, _CANONICAL_POINT)):
        c_float = native.number(raw, point)
        assert c_float is None or (rx.fullmatch(token) and repr(c_float) == repr(f)), (token, point)


@settings(max_examples=500)
@given(st.sampled_from(sorted(FIELDS)), TOKENS)
def test_any_token_in_any_field_is_read_as_the_grammar_reads_it(field, token):
    """No path makes a record of a number the grammar refuses; the fast path and both block
    scans give the reference parser's record when they take the line at all."""
    if any(c in token for c in "\n\r,]\t ") or not token:
        return  # a separator of the line, not a number's character
    if field == "process count" and token[-1] in ".;":
        return  # the line's last number: a period after it ends the sentence (as after a checkpoint's step)
    raw = ("2026-11-30T04:00:11.5Z " + FIELDS[field].format(token) + "\n").encode("utf-8", "surrogatepass")
    rec = parse_line(raw).record
    grammar = N.parse_unsigned if field in UNSIGNED_FIELDS else N.parse_float
    if grammar(token) is None:
        assert isinstance(rec, Malformed | None), (field, token, rec)
        assert parse_fast(raw) is None and B._steady_py(raw) is None
        assert native is None or native.steady(raw, B._save_of) is None


# -- both parse paths, both stores ----------------------------------------------------------------------
HOSTILE_LINES = [
    b"I1130 train_sft.py:301] LOSS-PARTS step=\xd9\xa1\xd9\xa5 ce=1.0",  # step=١٥: a phantom restart to 15
    b"I1130 train_sft.py:301] LOSS-PARTS step=+151 ce=1.0",
    b"I1130 train_sft.py:301] LOSS-PARTS step=-0 ce=1.0",
    "I1130 train_sft.py:301] LOSS-PARTS step=101 ce=١.0".encode(),  # step 101 is the next, good, step
    "I1130 train_sft.py:301] LOSS-PARTS step=１０１ ce=2.5".encode(),
    b"I1130 train_sft.py:301] LOSS-PARTS step=1_01 ce=2.5",
    "REQUIRED_RBF step=١٠ max=1.0 per_layer=[1.0] program=normal".encode(),
    "REQUIRED_RBF step=101 max=1.0 per_layer=[1.0,²] program=normal".encode(),
    b"REQUIRED_RBF step=101 max=+1.0 per_layer=[1.0] program=normal",
    "completed step: ٥, seconds: 1.0, TFLOP/s/device: 1.0, Tokens/s/device: 1.0, total_weights: 1, loss: 1.0".encode(),
    b"completed step: 101, seconds: 1.0, TFLOP/s/device: 1.0, Tokens/s/device: 1.0, total_weights: +1, loss: 1.0",
    b"completed step: 101, seconds: 1.0, TFLOP/s/device: 1.0, Tokens/s/device: 1.0, total_weights: 1, loss: NaN",
    "Restoring checkpoint from step ٥٠.".encode(),  # a restore that never happened
    b"Saved a checkpoint at step +100.",
    "Jax distributed system initialized! process_index=٠ process_count=32".encode(),
]


def _check_no_phantoms(store, run: str) -> None:
    assert all_good(store, run)  # every good step once, one incarnation
    assert recorded(store, run)["checkpoints"] == []
    with store.engine.begin() as conn:
        kinds = {f.kind for f in sync_findings(conn, run, check_run(store, run))}
    assert not kinds & {"gap", "resume_mismatch", "step_jump"}, kinds


def _log_with_hostile_lines() -> list[bytes]:
    return good_log(extra={100: [stamp(T0 + 100 * 10**9 + 1) + line for line in HOSTILE_LINES]})


def test_ingest_counts_each_hostile_number_as_a_bad_line(store, tmp_path):
    result = ingest_file(store, "u", write(tmp_path / "u.log", _log_with_hostile_lines()))
    assert (result.bad_lines, result.loss_parts, result.incarnations) == (len(HOSTILE_LINES), STEPS, 1)
    assert result.bad_samples and any("+151" in s for s in result.bad_samples)
    _check_no_phantoms(store, "u")


def test_the_live_path_counts_each_hostile_number_as_a_bad_line(store):
    model, _ = follow_lines(store, "v", _log_with_hostile_lines())
    assert model.counters.bad_lines == len(HOSTILE_LINES)
    _check_no_phantoms(store, "v")


def test_one_line_at_a_time_as_follow_reads_them():
    model = RunModel("w")
    for line in _log_with_hostile_lines():
        model.feed(line)
    batch = model.take()
    assert [r[2] for r in batch.loss_parts] == list(range(1, STEPS + 1))
    assert model.counters.bad_lines == len(HOSTILE_LINES) and len(batch.incarnations) == 1


@pytest.mark.parametrize("value, planned", [("1500", 1500), ("١٥٠٠", None), ("+1500", None), ("1_500", None),
                                            ("１５００", None), ("0", None)])
def test_the_configured_steps_follow_the_grammar_too(value, planned):
    model = RunModel("c")
    model.feed(f"Config param steps: {value}".encode())
    assert model.planned_steps == planned


# -- follow: real kubectl against the simulator -------------------------------------------------------------
FOLLOW_LINES = [
    "I1130 train_sft.py:301] LOSS-PARTS step=١٥ ce=2.5",  # once a phantom restart back to step 15
    "I1130 train_sft.py:301] LOSS-PARTS step=+151 ce=2.5",
    "I1130 train_sft.py:301] LOSS-PARTS step=-0 ce=2.5",
    "I1130 train_sft.py:301] LOSS-PARTS step=41 ce=١.0",  # step 41 itself comes next, good
    "I1130 checkpointing.py:401] Restoring checkpoint from step ١٥.",
]


@pytest.mark.timeout(120)
def test_follow_reads_no_phantom_from_hostile_numbers(make_simcluster, db_url, monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")
    sim = make_simcluster(scenario({"action": "write_lines", "at_step": 40, "lines": FOLLOW_LINES},
                                   jobsets=[{"name": "olmo3-sft", "hosts": 1,
                                             "trainer": {"steps": 120, "checkpoint_period": 1000}}]))
    sup = follow_sim(sim, db_url)
    r = assert_exactly_once(sim, db_url, "r")
    assert len(r["got"]) == 120 and not r["gaps"]
    assert follow_rows(db_url, "SELECT COUNT(*) FROM incarnations WHERE run = :r", "r") == [(1,)]
    assert not {kind for kind, _ in follow_findings(db_url, "r")} & {"resume_mismatch", "gap", "step_jump"}
    st_ = sup.status["r"]
    assert st_.done and st_.last_step == 120 and st_.failures == 0, st_.errors
    # (the live path's bad-line count: test_the_live_path_counts_each_hostile_number_as_a_bad_line)


def test_integers_too_long_for_int_are_refused_not_raised():
    digits = "9" * 5000  # int() raises beyond 4300 digits
    assert N.parse_unsigned(digits) is None and N.parse_integer(digits) is None and N.parse_number(digits) is None
    assert isinstance(parse_line(f"LOSS-PARTS step={digits} ce=1.0".encode()).record, Malformed)
    rec = parse_line(f"LOSS-PARTS step=1 ce=1.0 z={digits}".encode()).record
    assert isinstance(rec, LossParts) and rec.parts == {"z": digits}  # a word, not inf
    model = RunModel("long")
    model.feed(f"Config param steps: {digits}".encode())  # runs/ reads it with the same grammar
    assert model.planned_steps is None
