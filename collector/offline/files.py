"""Offline source: saved pod logs (plain, gzip, or stdin), read in blocks of whole lines.

Memory stays flat in file size: a block is a few MiB, and a line longer than MAX_LINE is
skipped (and reported) instead of being gathered."""

from __future__ import annotations

import gzip
import hashlib
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, NamedTuple

from steptail.parsers import MAX_LINE, candidate_lines, has_tag, split_timestamp
from steptail.parsers.block import parse_block

BLOCK = 4 << 20


class SourceError(Exception):
    """A path that cannot be read; the message is one line."""


@dataclass
class Source:
    name: str
    raw: BinaryIO  # the file as stored (for progress: bytes consumed)
    stream: BinaryIO  # decompressed bytes
    size: int | None
    # sha256 of the file as stored, taken while it is read (stdin: while it is spooled)
    hasher: _Digest | None = None
    pod: str | None = None  # the pod it was read from, when known (incarnations.pod)
    label: str | None = None  # the name recorded for it (default: `name`)

    def sha256(self) -> str | None:
        """The stored file's sha256, once it was read to its end in one pass; else None."""
        return self.hasher.hexdigest() if self.hasher is not None and self.hasher.complete else None

    def position(self) -> int:
        try:
            return self.raw.tell()
        except (OSError, ValueError):
            return 0

    def close(self) -> None:
        self.stream.close()
        self.raw.close()


class _Digest:
    """sha256 of bytes read in order from the start; `complete` once the end was reached."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.complete = False

    def update(self, data: bytes) -> None:
        if data:
            self.h.update(data)
        else:
            self.complete = True

    def hexdigest(self) -> str:
        return self.h.hexdigest()


class _HashedRaw:
    """A compressed file as GzipFile reads it (forward only), hashed on the way."""

    def __init__(self, raw: BinaryIO, digest: _Digest) -> None:
        self.raw, self.digest = raw, digest

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.digest.update(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        if (offset, whence) == (0, 0):  # a rewind (re-read from the start): hash again
            self.digest.__init__()
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()


def open_source(path: str) -> Source:
    """Open a path ('-' is stdin, spooled so that it can be peeked and re-read)."""
    digest = _Digest()
    if path == "-":
        spool = tempfile.TemporaryFile()
        while chunk := sys.stdin.buffer.read(1 << 20):
            digest.update(chunk)
            spool.write(chunk)
        digest.update(b"")
        spool.seek(0)
        raw, name, size = spool, "<stdin>", spool.seek(0, os.SEEK_END)
        spool.seek(0)
    else:
        try:
            raw = open(path, "rb")  # noqa: SIM115 - closed by Source.close
        except OSError as exc:
            raise SourceError(f"cannot read {path}: {exc.strerror}") from None
        if not os.path.isfile(path):
            raw.close()
            raise SourceError(f"cannot read {path}: not a regular file")
        name, size = path, os.path.getsize(path)
    magic = raw.read(2)
    raw.seek(0)
    stream: BinaryIO = raw
    if magic == b"\x1f\x8b":
        stream = gzip.GzipFile(fileobj=_HashedRaw(raw, digest), mode="rb")  # type: ignore[assignment]
        try:
            stream.peek(1)  # type: ignore[attr-defined]
        except (OSError, EOFError) as exc:
            raw.close()
            raise SourceError(f"cannot read {name}: {exc}") from None
    return Source(name, raw, stream, size, digest)


def first_timestamp(source: Source) -> int | None:
    """Kubelet timestamp of the first candidate line within the first block, if any."""
    head = source.stream.peek(1 << 20)[: 1 << 20] if hasattr(source.stream, "peek") else b""
    head = head[: head.rfind(b"\n") + 1]
    for line in candidate_lines(head):
        return split_timestamp(line)[0]
    return None


class Piece(NamedTuple):
    """What a source yields: a block of whole lines, or a line that could not be kept."""

    block: bytes = b""
    lines: int = 0
    bad: str | None = None  # set for an over-long tagged line or a cut-off last line


def read_pieces(source: Source, block_size: int = BLOCK) -> Iterator[Piece]:
    carry = b""
    skipping = False  # inside a line longer than MAX_LINE
    skipped = 0
    tagged = False
    read = source.stream.read
    # a plain file (stdin's spool is hashed already) read from its start: hashed as it goes
    digest = source.hasher if source.stream is source.raw and source.name != "<stdin>" \
        and source.hasher is not None and not source.hasher.complete and source.raw.tell() == 0 else None
    while chunk := read(block_size):
        if digest is not None:
            digest.update(chunk)
        if skipping:
            nl = chunk.find(b"\n")
            if nl < 0:
                skipped += len(chunk)
                tagged = tagged or has_tag(chunk[:4096])
                continue
            skipped += nl
            yield Piece(lines=1, bad=f"line of {skipped} bytes skipped" if tagged else None)
            skipping, chunk = False, chunk[nl + 1 :]
        buf = carry + chunk if carry else chunk
        cut = buf.rfind(b"\n") + 1
        block, carry = buf[:cut], buf[cut:]
        if block:
            yield Piece(block, block.count(b"\n"))
        if len(carry) > MAX_LINE:
            skipping, skipped, tagged = True, len(carry), has_tag(carry[:4096])
            carry = b""
    if digest is not None:
        digest.update(b"")  # the end: complete
    if skipping:
        yield Piece(lines=1, bad=f"line of {skipped} bytes without newline skipped" if tagged else None)
    elif carry:
        # The writer was cut off: a record on an unterminated last line cannot be trusted.
        yield Piece(lines=1, bad="cut-off last line: " + carry[:200].decode("utf-8", "replace")
                    if has_tag(carry) else None)


# -- ranges of a plain file, read by worker processes themselves -----------------------------
_PROBE = 64 << 10


def line_ranges(source: Source, block_size: int = BLOCK) -> list[tuple[int, int]] | None:
    """Byte ranges of whole lines covering a plain file (the last may end without a newline),
    so that workers can read their own blocks instead of receiving them through a pipe. None
    for compressed input, stdin, or a line too long to find a boundary in: read_pieces then."""
    if source.stream is not source.raw or source.name == "<stdin>" or source.size is None:
        return None
    fd, size = source.raw.fileno(), source.size
    ranges, pos = [], 0
    while pos < size:
        end = pos + block_size
        if end >= size:
            ranges.append((pos, size))
            break
        probe = os.pread(fd, _PROBE, end)
        nl = probe.find(b"\n")
        if nl < 0:
            probe = os.pread(fd, MAX_LINE + 1, end)
            nl = probe.find(b"\n")
            if nl < 0:
                return None
        ranges.append((pos, end + nl + 1))
        pos = end + nl + 1
    return ranges


def read_range(path: str, start: int, end: int) -> Piece:
    """The piece of a plain file between two line boundaries, as read_pieces would give it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.pread(fd, end - start, start)
    finally:
        os.close(fd)
    cut = data.rfind(b"\n") + 1
    block, tail = data[:cut], data[cut:]
    lines = block.count(b"\n")
    if not tail:
        return Piece(block, lines)
    if len(tail) > MAX_LINE:
        bad = f"line of {len(tail)} bytes without newline skipped" if has_tag(tail[:4096]) else None
    else:
        bad = "cut-off last line: " + tail[:200].decode("utf-8", "replace") if has_tag(tail) else None
    return Piece(block, lines + 1, bad)


def parse_range(path: str, start: int, end: int) -> tuple:
    """In an ingest worker: read one range and parse its block (the block stays there). Lives
    here, away from the SQL and Parquet modules, so that workers import only the parsers."""
    piece = read_range(path, start, end)
    return piece.lines, piece.bad, parse_block(piece.block)


def worker_init() -> None:
    """Ingest worker set-up: no cyclic GC (parse results are acyclic), and exit when the
    ingest process dies: pool workers otherwise wait for work forever (holding its pipes)."""
    import gc
    import multiprocessing as mp
    import threading
    from multiprocessing.connection import wait

    gc.disable()
    parent = mp.parent_process()
    if parent is not None:

        def watch() -> None:
            wait([parent.sentinel])
            os._exit(1)

        threading.Thread(target=watch, name="watch-parent", daemon=True).start()
