"""One log line of bytes in, one typed record (or nothing) out. Never raises on input."""

from __future__ import annotations

import re

from steptail.parsers.bounds import (
    CE_RAW_MAX,
    CONFIG_NAME_MAX,
    INT32_MAX,
    INT64_MAX,
    PROGRAM_MAX,
    has_nul,
    int32,
    int64,
)
from steptail.parsers.records import (
    Checkpoint,
    ConfigParam,
    LossParts,
    Malformed,
    ParsedLine,
    PodStep,
    Record,
    RequiredRbf,
    TrainerStart,
)
from steptail.parsers.timestamps import split_timestamp
from steptail.parsers.values import parse_float, parse_unsigned, parse_value

_ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_PER_LAYER = re.compile(r"per_layer=\[([^\]]*)\]")
# Numbers end at an ASCII blank (parsers.numbers: a U+00A0 or U+3000 is not a separator a log
# prints, and int() would forgive it around digits): the token is judged whole.
_CKPT = re.compile(r"(Restoring checkpoint from step|Saved a checkpoint at step)[ \t]+([^ \t]+?)\.?(?:[ \t]|$)")
# Each value runs to its separator; whatever it holds then goes to the number grammar (a count
# like ";0" is a malformed start-up line, not one without counts).
_PROC = re.compile(r"process_index=([^ \t]*?)[ \t,;]+process_count=([^ \t]*?)[.,;]?(?:[ \t]|$)")
_CONFIG = re.compile(r"Config param (\S+?):(?: (.*))?$")

# Tags that make a line a candidate; also used to pick candidate lines out of a chunk.
TAGS = (
    b"LOSS-PARTS",
    b"REQUIRED_RBF",
    b"completed step:",
    b"Config param ",
    b"Restoring checkpoint",
    b"Saved a checkpoint",
    b"distributed system",
)
_BLANK = " \t"  # str.strip() of those only, for the same reason
# Longest line kept; a longer one is cut and, if tagged, counted as malformed.
MAX_LINE = 1 << 20


def clean(raw: bytes) -> tuple[int | None, str | None, str]:
    """Strip line ending, kubelet timestamp and ANSI codes; decode leniently."""
    ns, ts, rest = split_timestamp(raw.rstrip(b"\r\n"))
    return ns, ts, _text(rest)


def message(raw: bytes, stamped: bool) -> str:
    """`clean`'s text of a line whose timestamp was read already (`stamped`: it has one, and
    the message starts after the first space, as a timestamp holds none)."""
    raw = raw.rstrip(b"\r\n")
    return _text(raw[raw.find(b" ") + 1 :] if stamped else raw)


def _text(rest: bytes) -> str:
    if b"\x1b" in rest:
        rest = _ANSI.sub(b"", rest)
    return rest.decode("utf-8", "replace")


def parse_line(raw: bytes) -> ParsedLine:
    """Parse one line (with or without its newline)."""
    ns, ts, text = clean(raw)
    if len(raw) > MAX_LINE:
        tagged = any(t.decode() in text for t in TAGS)
        bad = Malformed("?", "line too long", text[:200]) if tagged else None
        return ParsedLine(ns, ts, bad)
    return ParsedLine(ns, ts, parse_message(text))


def parse_message(text: str) -> Record | Malformed | None:
    """The record in a message (timestamp already removed), None for an ordinary line."""
    try:
        if (i := text.find("LOSS-PARTS")) >= 0 and _tag_ends(text, i + 10):
            return _loss_parts(text, text[i + 10 :])
        if (i := text.find("REQUIRED_RBF")) >= 0 and _tag_ends(text, i + 12):
            return _required_rbf(text, text[i + 12 :])
        if (i := text.find("completed step:")) >= 0:
            return _pod_step(text, text[i + 15 :])
        if "Config param " in text:
            return _config(text)
        if "checkpoint" in text and (m := _CKPT.search(text)):
            step = parse_unsigned(m.group(2))
            if _bad_step(step):
                return Malformed("checkpoint", f"step {m.group(2)!r} is not an integer in 0..{INT32_MAX}", text)
            return Checkpoint("restore" if m.group(1).startswith("Restoring") else "save", step)
        if "distributed system" in text:
            return _trainer_start(text)
    except Exception as exc:  # a parser bug must never stop a follower
        return Malformed("?", f"parser error: {exc!r}", text[:200])
    return None


def _tag_ends(text: str, end: int) -> bool:
    return end == len(text) or text[end].isspace()


def _pairs(body: str, tag: str, text: str) -> dict[str, str] | Malformed:
    out: dict[str, str] = {}
    for token in body.replace("\t", " ").split(" "):  # ASCII blanks only: see _CKPT
        key, eq, value = token.partition("=")
        if not eq:
            continue  # free text after the pairs is tolerated
        if not key or not value:
            return Malformed(tag, f"empty key or value in {token!r}", text)
        if key in out:
            return Malformed(tag, f"key {key!r} repeated", text)
        if has_nul(token):
            return Malformed(tag, f"NUL character in {token!r}", text)
        out[key] = value
    return out


def _bad_step(step: int | None) -> bool:
    """Not a step a record can carry: steps are unsigned ASCII integers (parsers.numbers) and
    the columns 32-bit."""
    return step is None or not 0 <= step <= INT32_MAX


def _loss_parts(text: str, body: str) -> LossParts | Malformed:
    pairs = _pairs(body, "LOSS-PARTS", text)
    if isinstance(pairs, Malformed):
        return pairs
    step_s, ce_s = pairs.pop("step", None), pairs.pop("ce", None)
    if step_s is None or ce_s is None:
        return Malformed("LOSS-PARTS", "step and ce are required", text)
    step, ce = parse_unsigned(step_s), parse_float(ce_s)
    if _bad_step(step):
        return Malformed("LOSS-PARTS", f"step {step_s!r} is not an integer in 0..{INT32_MAX}", text)
    if ce is None:
        return Malformed("LOSS-PARTS", f"ce {ce_s!r} is not a number", text)
    if len(ce_s) > CE_RAW_MAX:
        return Malformed("LOSS-PARTS", f"ce of {len(ce_s)} characters (at most {CE_RAW_MAX} are kept)", text)
    return LossParts.make(step, ce, ce_s, {k: parse_value(v) for k, v in pairs.items()})


def _required_rbf(text: str, body: str) -> RequiredRbf | Malformed:
    m = _PER_LAYER.search(body)
    if m is None:
        return Malformed("REQUIRED_RBF", "per_layer=[…] is required", text)
    layers: list[float] = []
    for item in m.group(1).split(","):
        item = item.strip(_BLANK)
        if item:
            v = parse_float(item)
            if v is None:
                return Malformed("REQUIRED_RBF", f"per_layer value {item!r}", text)
            layers.append(v)
    pairs = _pairs(body[: m.start()] + " " + body[m.end() :], "REQUIRED_RBF", text)
    if isinstance(pairs, Malformed):
        return pairs
    step = parse_unsigned(pairs.get("step", ""))
    mx = parse_float(pairs.get("max", ""))
    if _bad_step(step) or mx is None:
        return Malformed("REQUIRED_RBF", f"step (integer in 0..{INT32_MAX}) and max (number) are required", text)
    program = pairs.get("program")
    if program is not None and len(program) > PROGRAM_MAX:
        return Malformed("REQUIRED_RBF", f"program of {len(program)} characters (at most {PROGRAM_MAX})", text)
    return RequiredRbf.make(step, mx, layers, program)


_POD_FIELDS = {
    "seconds": "seconds",
    "TFLOP/s/device": "tflops",
    "Tokens/s/device": "tokens_per_s",
    "total_weights": "total_weights",
    "loss": "loss",
}


def _pod_step(text: str, body: str) -> PodStep | Malformed:
    head, *fields = body.split(",")
    step = parse_unsigned(head.strip(_BLANK))
    if _bad_step(step):
        return Malformed("completed step", f"step {head.strip(_BLANK)!r} is not an integer in 0..{INT32_MAX}", text)
    known: dict[str, float | int | None] = {}
    extra: dict[str, int | float | str] = {}
    for field in fields:
        name, colon, value = field.partition(":")
        name, value = name.strip(_BLANK), value.strip(_BLANK)
        if not colon or not name:
            continue
        if name == "total_weights":
            weights = parse_unsigned(value)
            if weights is None or not int64(weights):
                return Malformed("completed step", f"total_weights {value!r} is not an integer in 0..{INT64_MAX}", text)
            known["total_weights"] = weights
        elif name in _POD_FIELDS:
            number = parse_float(value)
            if number is None:
                return Malformed("completed step", f"{name} {value!r} is not a number", text)
            known[_POD_FIELDS[name]] = number
        elif has_nul(name, value):
            return Malformed("completed step", f"NUL character in {field.strip()!r}", text)
        else:
            extra[name] = parse_value(value)
    return PodStep(step, extra=extra, **known)


def _config(text: str) -> ConfigParam | Malformed:
    m = _CONFIG.search(text)
    if m is None:
        return Malformed("Config param", "expected `Config param NAME: VALUE`", text)
    name, value = m.group(1), (m.group(2) or "").strip()
    if len(name) > CONFIG_NAME_MAX:
        return Malformed("Config param", f"name of {len(name)} characters (at most {CONFIG_NAME_MAX})", text)
    if has_nul(name, value):
        return Malformed("Config param", "NUL character in the name or value", text)
    return ConfigParam(name, value)


def _trainer_start(text: str) -> TrainerStart | Malformed | None:
    if "Attempting to initialize the jax distributed system" in text:
        return TrainerStart()
    if "distributed system initialized" in text:
        m = _PROC.search(text)
        if m is None:
            return TrainerStart()
        index, count = parse_unsigned(m.group(1)), parse_unsigned(m.group(2))
        if index is None or count is None or not (int32(index) and int32(count)):
            return Malformed("distributed system", f"process_index and process_count must be integers in "
                             f"0..{INT32_MAX}", text)
        return TrainerStart(index, count)
    return None
