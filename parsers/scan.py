"""Pick the candidate lines out of a block of complete lines without a Python loop per line.

Most lines of a trainer log carry no record; finding tags with one regex pass over a block
(in C) and cutting out only their lines is what keeps ingest near grep's speed."""

from __future__ import annotations

import re
from collections.abc import Iterator

from steptail.parsers.line import TAGS

CANDIDATE = re.compile(b"|".join(re.escape(t) for t in TAGS))


def candidate_lines(block: bytes) -> Iterator[bytes]:
    """Each line of `block` (complete lines, `\\n`-separated) that holds a tag, once, in order."""
    end = -1
    for m in CANDIDATE.finditer(block):
        if m.start() <= end:
            continue  # a second tag on a line already yielded
        start = block.rfind(b"\n", 0, m.start()) + 1
        end = block.find(b"\n", m.end())
        if end < 0:
            end = len(block)
        yield block[start:end]


def has_tag(line: bytes) -> bool:
    return CANDIDATE.search(line) is not None
