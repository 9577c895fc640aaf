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

from parsers.fast import (
    LOSS_IN_BLOCK,
    POD_IN_BLOCK,
    RBF_IN_BLOCK,
    loss_item,
    parse_fast,
    pod_item,
    rbf_item,
    ts_of,
)
from parsers.line import MAX_LINE
from parsers.scan import CANDIDATE

_LOSS, _RBF, _POD = b"LOSS-PARTS", b"REQUIRED_RBF", b"completed step:"
_RARE = (b"Config param ", b"Restoring checkpoint", b"Saved a checkpoint", b"distributed system")
# Per kind: its scanner, tag, the tags parse_fast tries first, and the item builder.
_KINDS = (
    (LOSS_IN_BLOCK, _LOSS, (), lambda ts, g: loss_item(ts, *g)),
    (RBF_IN_BLOCK, _RBF, (_LOSS,), lambda ts, g: rbf_item(ts, *g)),
    (POD_IN_BLOCK, _POD, (_LOSS, _RBF), pod_item),
)


def parse_block(block: bytes) -> list[tuple]:
    """One tuple per candidate line, in order: parse_fast's tuple + (line,), or ("X", line)
    for a line the general parser must read."""
    items = _canonical(block)
    return items if items is not None else _line_by_line(block)


def _line_by_line(block: bytes) -> list[tuple]:
    out = []
    append = out.append
    find, rfind = block.find, block.rfind
    end = -1
    for m in CANDIDATE.finditer(block):
        if m.start() <= end:
            continue
        start = rfind(b"\n", 0, m.start()) + 1
        end = find(b"\n", m.end())
        if end < 0:
            end = len(block)
        line = block[start:end]
        item = parse_fast(line) if end - start <= MAX_LINE else None
        append(("X", line) if item is None else item + (line,))
    return out


def _canonical(block: bytes) -> list[tuple] | None:
    """The items of a block whose per-step lines are all canonical, else None."""
    if not block.endswith(b"\n"):
        return None
    find, rfind = block.find, block.rfind
    found: list[tuple[int, tuple]] = []
    append = found.append
    for scanner, tag, earlier, build in _KINDS:
        n = 0
        for m in scanner.finditer(block):
            tag_at, end = m.start(), m.end() - 1
            start = rfind(b"\n", 0, tag_at) + 1
            if find(tag, start, tag_at) >= 0 or find(b"\x1b", start, end) >= 0 or end - start > MAX_LINE:
                return None  # not the line's first tag, ANSI codes, too long: the reference decides
            for other in earlier:
                if find(other, start, end) >= 0:
                    return None
            line = block[start:end]
            item = build(ts_of(line), m.groups())
            if item is None:
                return None
            append((start, item + (line,)))
            n += 1
        if n != block.count(tag):
            return None  # some line with this tag is not canonical
    for tag in _RARE:
        i = find(tag)
        while i >= 0:
            start = rfind(b"\n", 0, i) + 1
            end = find(b"\n", i)
            append((start, ("X", block[start:end])))
            i = find(tag, end)
    found.sort(key=itemgetter(0))
    for a, b in pairwise(found):
        if a[0] == b[0]:
            return None  # one line, two tags: the reference decides which
    return [item for _, item in found]
