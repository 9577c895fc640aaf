"""A block of whole lines -> its candidate lines, canonical ones already parsed.

Pure and picklable in and out, so ingest can run it in worker processes while the main
process applies the results in order."""

from __future__ import annotations

from parsers.fast import parse_fast
from parsers.line import MAX_LINE
from parsers.scan import candidate_lines


def parse_block(block: bytes) -> list[tuple]:
    """One tuple per candidate line, in order: parse_fast's tuple + (line,), or ("X", line)
    for a line the general parser must read."""
    out = []
    append = append_x = out.append
    for line in candidate_lines(block):
        item = parse_fast(line) if len(line) <= MAX_LINE else None
        if item is None:
            append_x(("X", line))
        else:
            append(item + (line,))
    return out
