"""A block of whole lines -> its candidate lines, canonical ones already parsed.

Pure and picklable in and out, so ingest can run it in worker processes while the main
process applies the results in order.

Two ways to the same result. The steady state of a training log is blocks whose every
LOSS-PARTS, REQUIRED_RBF and `completed step` line is canonical: `_canonical` finds those
with one scan per record kind (the regex engine's literal search, no Python per line) and
the few other tagged lines with bytes.find. Any block it cannot vouch for line by line
(a non-canonical record, two tags on one line, ANSI codes…) goes through `_line_by_line`,
the reference. tests/test_parser_fast.py checks that both agree."""

from __future__ import annotations

from itertools import pairwise
from operator import itemgetter
from typing import NamedTuple

from steptail.parsers.bounds import CLOCK_JUMP_NS
from steptail.parsers.fast import (
    LOSS_LINE,
    POD_LINE,
    RBF_LINE,
    ROW_STEP,
    ROW_TS,
    loss_item,
    loss_row,
    parse_fast,
    pod_item,
    pod_row,
    rbf_item,
    rbf_row,
    ts_of,
)
from steptail.parsers.line import MAX_LINE, TAGS, parse_line
from steptail.parsers.records import BlockKind, Checkpoint, ItemKind
from steptail.parsers.scan import candidate_lines

try:  # parsers/_steady.c, built at install; without it the Python scan does the same work
    from steptail.parsers import _steady as _native
except ImportError:
    _native = None

_LOSS, _RBF, _POD = b"LOSS-PARTS", b"REQUIRED_RBF", b"completed step:"
_RARE = tuple(t for t in TAGS if t not in (_LOSS, _RBF, _POD))  # start-up, config, checkpoints
# Per kind: its line regex, tag, the tags parse_fast tries first, the item builder (all
# checks) and the row builder (value checks only, for lines of a vouched-for shape).
_KINDS = (
    (LOSS_LINE, _LOSS, (), lambda ts, g: loss_item(ts, *g), lambda ts, g: loss_row(ts, *g)),
    (RBF_LINE, _RBF, (_LOSS,), lambda ts, g: rbf_item(ts, *g), lambda ts, g: rbf_row(ts, *g)),
    (POD_LINE, _POD, (_LOSS, _RBF), pod_item, pod_row),
)
# Templates: a log prints the same few line shapes over and over. With every digit folded to
# 1, whether a line matches its kind's regex and where each group lies is the same for all
# lines of one shape (leading zeros aside, which the builders reject), so the regex runs once
# per shape and every other line is cut at the remembered offsets.
_FOLD_ALL = bytes.maketrans(b"0123456789", b"1111111111")
_TEMPLATES: tuple[dict, dict, dict] = ({}, {}, {})


def _template(line: bytes, line_rx, tag: bytes, earlier, build):
    """A cutter for canonical lines of this shape (line -> the regex's groups), or False (the
    reference must read it). An absent optional group comes out empty, not None. The shape is
    vouched for only if the full item builder accepts this line."""
    if b"\x1b" in line or len(line) > MAX_LINE or any(o in line for o in earlier):
        return False
    m = line_rx.match(line, line.find(tag))
    if m is None:
        return False
    if build(ts_of(line), m.groups()) is None:
        return False
    spans = tuple(m.span(g) for g in range(1, line_rx.groups + 1))
    if line_rx is LOSS_LINE and spans[2][0] >= 0:
        keys = line[spans[2][0] : spans[2][1]].split()
        if any(ch in b"0123456789" for key in keys for ch in key.partition(b"=")[0]):
            return False  # keys with digits: folded shapes could hide a repeated key
    return itemgetter(*(slice(a, b) if a >= 0 else slice(0, 0) for a, b in spans))


# A block the steady scan refuses (a restart's start-up lines, one odd line) is cut in PARTS
# and each part tried again, down to MIN_PART: only the parts around the odd lines then go
# line by line, not the whole block.
PARTS = 16
MIN_PART = 64 << 10


def parse_block(block: bytes) -> tuple:
    """One of:
    (BlockKind.STEADY, Steady)  a steady-state block;
    (BlockKind.LINES, items)    one item per candidate line in order: parse_fast's tuple +
                                (line,), or (ItemKind.GENERAL, line) for the general parser;
    (BlockKind.SPLIT, parts)    (start, end, parse_block(block[start:end])) per part, in order."""
    steady = _steady(block)
    if steady is not None:
        return (BlockKind.STEADY, steady)
    cuts = _cuts(block, PARTS) if len(block) >= 2 * MIN_PART else []
    if len(cuts) < 2:  # small, or one long line
        return (BlockKind.LINES, line_by_line(block))
    return (BlockKind.SPLIT, [(a, b, parse_block(block[a:b])) for a, b in cuts])


def _cuts(block: bytes, parts: int) -> list[tuple[int, int]]:
    """`parts` ranges of whole lines covering the block (fewer if lines are long)."""
    out, start, size = [], 0, len(block) // parts
    while start < len(block):
        end = block.find(b"\n", start + size) + 1 or len(block)
        out.append((start, end))
        start = end
    return out


def line_by_line(block: bytes) -> list[tuple]:
    """The reference: every candidate line on its own."""
    out = []
    for line in candidate_lines(block):
        item = parse_fast(line) if len(line) <= MAX_LINE else None
        out.append((ItemKind.GENERAL, line) if item is None else item + (line,))
    return out


def _save_of(line: bytes) -> tuple | None:
    """(ts_ns, step) of a checkpoint-save line, else None (a start-up, restore, config or odd
    line: the model reads those alone)."""
    parsed = parse_line(line)
    if not isinstance(parsed.record, Checkpoint) or parsed.record.kind != "save":
        return None
    return parsed.ts_ns, parsed.record.step


def _saves(block: bytes) -> list[tuple] | None:
    """The block's rare-tag lines if each is a checkpoint save: (line start, (ts_ns, step),
    line) in line order, else None."""
    find, rfind = block.find, block.rfind
    out = []
    for tag in _RARE:
        i = find(tag)
        while i >= 0:
            start = rfind(b"\n", 0, i) + 1
            end = find(b"\n", i)
            line = block[start:end]
            row = _save_of(line)
            if row is None:
                return None
            out.append((start, row, line))
            i = find(tag, end)
    out.sort(key=itemgetter(0))
    return out


def _steady(block: bytes) -> Steady | None:
    """The C scan when it is built, else the Python one. What the C scan does not vouch for
    goes line by line (the Python scan would accept little more, and at ten times the cost)."""
    if _native is None:
        return _steady_py(block)
    out = _native.steady(block, _save_of)
    return None if out is None else Steady(*out)


class Steady(NamedTuple):
    """A block that a run model can take whole: canonical per-step lines and checkpoint saves
    only, each kind's steps strictly rising, timestamps all present and non-decreasing by
    steps of at most parsers.bounds.CLOCK_JUMP_NS (or all absent), no line repeated. Rows
    carry no kind and no line: cheap to pickle."""

    # Columns (one tuple per field of parsers.fast's rows, in line order), or () when none:
    loss: tuple  # ts_ns, step, ce, ce_raw, parts_json
    rbf: tuple  # ts_ns, step, max, per_layer_json, program
    pod: tuple  # ts_ns, step, seconds, tflops, tokens_per_s, total_weights, loss
    saves: list[tuple]  # (ts_ns, step) of `Saved a checkpoint at step N.`
    first_ts: int | None
    last_ts: int | None
    last_seconds: list[bytes]  # the lines stamped from 4 s before last_ts's second on, for the dedupe cursor
    forgot_ts: int | None  # the stamp of the line before those (None if none): unused (the cursor holds nothing back)


def _steady_py(block: bytes) -> Steady | None:
    if not block.endswith(b"\n"):
        return None
    find, rfind = block.find, block.rfind
    found: list[tuple[int, int, tuple, bytes]] = []  # (line start, kind, row, line)
    append = found.append
    for kind, (line_rx, tag, earlier, build, row_of) in enumerate(_KINDS):
        templates = _TEMPLATES[kind]
        # bytes.find is the scan. Starting each search at the next line, every hit is its
        # line's first tag of this kind.
        tag_at = find(tag)
        while tag_at >= 0:
            start = rfind(b"\n", 0, tag_at) + 1
            end = find(b"\n", tag_at)
            line = block[start:end]
            shape = line.translate(_FOLD_ALL)
            cut = templates.get(shape)
            if cut is None:
                if len(templates) >= 4096:
                    templates.clear()
                cut = templates[shape] = _template(line, line_rx, tag, earlier, build)
            if cut is False:
                return None  # not canonical: the reference decides
            row = row_of(ts_of(line), cut(line))
            if row is None:
                return None
            append((start, kind, row, line))
            tag_at = find(tag, end)
    rare = _saves(block)
    if rare is None:
        return None
    found += ((start, 3, row, line) for start, row, line in rare)
    found.sort(key=itemgetter(0))
    columns: tuple[list, list, list, list] = ([], [], [], [])
    for a, b in pairwise(found):
        if a[0] == b[0]:
            return None  # one line, two tags: the reference decides which
    prev_ts, run_from = (found[0][2][ROW_TS] if found else None), 0
    for n, (_, kind, row, line) in enumerate(found):
        ts, step = row[ROW_TS], row[ROW_STEP]
        rows = columns[kind]
        if rows and step <= rows[-1][ROW_STEP]:
            return None  # a step going back or repeating: the model decides
        if ts != prev_ts:
            if ts is None or prev_ts is None or ts < prev_ts or ts - prev_ts > CLOCK_JUMP_NS:
                return None  # timestamps missing on some lines, going back or jumping ahead
            prev_ts, run_from = ts, n
        elif ts is not None and any(found[k][3] == line for k in range(run_from, n)):
            return None  # the same line twice at one instant: the cursor decides
        rows.append(row)
    if not found:
        return None
    first, last = found[0][2][ROW_TS], found[-1][2][ROW_TS]
    since = None if last is None else last - last % 10**9 - 4 * 10**9  # runs.cursor.remember_from
    at_last = [line for _, _, row, line in found if since is not None and row[ROW_TS] >= since]
    before = [row[ROW_TS] for _, _, row, _ in found if since is not None and row[ROW_TS] < since]
    loss, rbf, pod = (tuple(zip(*rows, strict=True)) for rows in columns[:3])  # pickles lighter
    return Steady(loss, rbf, pod, columns[3], first, last, at_last, before[-1] if before else None)
