"""A block of whole lines -> its candidate lines, canonical ones already parsed.

Pure and picklable in and out, so ingest can run it in worker processes while the main
process applies the results in order."""

from __future__ import annotations

from parsers.fast import parse_fast
from parsers.line import MAX_LINE
from parsers.scan import CANDIDATE


def parse_block(block: bytes) -> list[tuple]:
    """One tuple per candidate line, in order: parse_fast's tuple + (line,), or ("X", line)
    for a line the general parser must read."""
    out = []
    append = out.append
    find, rfind = block.find, block.rfind
    end = -1
    for m in CANDIDATE.finditer(block):  # inlined parsers.scan.candidate_lines: the hot loop
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
