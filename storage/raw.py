"""The raw process-0 log of a followed run (`follow --raw DIR`): every line the follower read,
as kubectl printed it (kubelet timestamp included, re-read overlaps included: the audit of
what was read), in gzip segments beside the store:

    DIR/<run>/<stream key, quoted>/<seq>.log.gz      (stream.json beside them: key and pod)

The follower hands each line to `RawLog.add` (on the event loop: an append). The sink takes
the lines with the model's batch (`take`) and, on its commit thread, writes them with
`write` as one new gzip member, flushed and fsynced before the SQL transaction: no row is
committed whose line is not in a segment. A crash leaves at most a truncated last member,
which readers skip (`read_members`); a new process never appends to an old segment, it
starts the next one. A segment is closed (its sha256 known) when it reaches `cap` bytes
uncompressed and at shutdown; run_files records every segment (storage.run_files)."""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, unquote

from steptail.storage.durable import fsync_path, hidden_name
from steptail.storage.paths import inside
from steptail.storage.run_files import RAW_SEGMENT, RunFile

CAP = 64 << 20  # uncompressed bytes per segment
SUFFIX = ".log.gz"
META = "stream.json"
LEVEL = 6


def stream_dir_name(stream: str) -> str:
    """A stream key (uid/container/restart) as one safe path component, reversibly."""
    return quote(stream, safe="-_.") if stream not in (".", "..") else quote(stream, safe="")


def stream_of_dir(name: str) -> str:
    return unquote(name)


@dataclass
class _Pending:
    """Lines of one stream read since the last take."""

    pod: str | None
    lines: list[bytes] = field(default_factory=list)
    first_ns: int | None = None
    last_ns: int | None = None


@dataclass
class RawChunk:
    """What one take() hands the commit thread: per stream, the lines in read order."""

    streams: dict[str, _Pending]
    written: bool = False  # in a segment, fsynced: a retried SQL commit does not write it again

    def __len__(self) -> int:
        return sum(len(p.lines) for p in self.streams.values())


class _Segment:
    def __init__(self, run: str, path: Path, fd: int) -> None:
        self.run, self.path, self.fd = run, path, fd
        self.hash = hashlib.sha256()  # of the file's bytes: only this process wrote them
        self.size = 0  # compressed bytes on disk
        self.bytes = 0  # uncompressed
        self.lines = 0
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.sha256: str | None = None  # set when closed

    def record(self) -> RunFile:
        return RunFile(self.run, RAW_SEGMENT, str(self.path), self.sha256, self.bytes, self.lines,
                       self.first_ns, self.last_ns)

    def close(self) -> None:
        if self.sha256 is None:
            self.sha256 = self.hash.hexdigest()
            os.close(self.fd)


class RawLog:
    """One run's raw segments. `add` runs on the event loop; `write` and `close` on the
    sink's commit thread (one at a time: the sink serialises its commits)."""

    def __init__(self, root: str | os.PathLike, run: str, cap: int = CAP, level: int = LEVEL) -> None:
        self.root = inside(root, run)  # a run name that is not one component is refused
        self.run, self.cap, self.level = run, cap, level
        self._pending: dict[str, _Pending] = {}
        self._open: dict[str, _Segment] = {}
        self._meta_done: set[str] = set()
        self.touched: dict[str, RunFile] = {}  # path -> record not committed to run_files yet

    # -- event loop -----------------------------------------------------------------------
    def add(self, stream: str, line: bytes, ts_ns: int | None, pod: str | None = None) -> None:
        """One line as read (per-line cost: a dict look-up and an append)."""
        p = self._pending.get(stream)
        if p is None:
            p = self._pending[stream] = _Pending(pod)
        p.lines.append(line)
        if ts_ns is not None:
            if p.first_ns is None:
                p.first_ns = ts_ns
            p.last_ns = ts_ns

    def take(self) -> RawChunk | None:
        if not self._pending:
            return None
        chunk, self._pending = RawChunk(self._pending), {}
        return chunk

    # -- commit thread --------------------------------------------------------------------
    def write(self, chunk: RawChunk) -> None:
        """Each stream's lines as one gzip member, fsynced. Raises OSError (the caller keeps
        the rows uncommitted and retries); a member cut short is truncated away first."""
        if chunk.written:
            return
        for stream, p in chunk.streams.items():
            if p.lines:
                self._write_stream(stream, p)
                p.lines = []  # written: a retry after a later stream failed skips it
        chunk.written = True

    def _write_stream(self, stream: str, p: _Pending) -> None:
        seg = self._open.get(stream)
        if seg is None:
            seg = self._new_segment(stream, p.pod)
        data = b"".join(p.lines)
        z = zlib.compressobj(self.level, zlib.DEFLATED, 31)  # 31: a gzip member
        member = z.compress(data) + z.flush()
        try:
            view, written = memoryview(member), 0
            while written < len(member):  # os.write may write less than asked
                written += os.write(seg.fd, view[written:])
            os.fsync(seg.fd)
        except OSError:
            try:
                os.ftruncate(seg.fd, seg.size)  # no half member before the next one
            except OSError:
                self._open.pop(stream, None)  # cannot repair: the next write starts a new segment
                os.close(seg.fd)
            raise
        seg.hash.update(member)
        seg.size += written
        seg.bytes += len(data)
        seg.lines += len(p.lines)
        if p.first_ns is not None and seg.first_ns is None:
            seg.first_ns = p.first_ns
        if p.last_ns is not None:
            seg.last_ns = p.last_ns
        if seg.bytes >= self.cap:
            seg.close()
            del self._open[stream]
        self.touched[str(seg.path)] = seg.record()

    def _new_segment(self, stream: str, pod: str | None) -> _Segment:
        folder = inside(self.root, stream_dir_name(stream))
        if stream not in self._meta_done:
            fresh = not folder.is_dir()
            folder.mkdir(parents=True, exist_ok=True)
            meta = folder / META
            if not meta.exists():
                tmp = hidden_name(meta, str(os.getpid()))
                tmp.write_text(json.dumps({"run": self.run, "stream": stream, "pod": pod}) + "\n")
                fsync_path(tmp)
                tmp.rename(meta)
            if fresh:
                fsync_path(folder.parent, directory=True)
            self._meta_done.add(stream)
        seq = max((_seq(n) for n in os.listdir(folder)), default=0) + 1
        while True:  # never an old segment: another process (or a crashed one) wrote those
            path = folder / f"{seq:06d}{SUFFIX}"
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
                break
            except FileExistsError:
                seq += 1
        fsync_path(folder, directory=True)
        seg = self._open[stream] = _Segment(self.run, path, fd)
        return seg

    def close(self) -> None:
        """Every open segment closed (sha256 known): at shutdown, after the final commit."""
        for seg in self._open.values():
            seg.close()
            self.touched[str(seg.path)] = seg.record()
        self._open.clear()

    def take_touched(self) -> list[RunFile]:
        touched, self.touched = list(self.touched.values()), {}
        return touched

    def restore_touched(self, records: list[RunFile]) -> None:
        """A commit that failed: record these with the next one (a newer state wins)."""
        for r in records:
            self.touched.setdefault(r.path, r)


def _seq(name: str) -> int:
    if name.endswith(SUFFIX) and name[: -len(SUFFIX)].isdigit():
        return int(name[: -len(SUFFIX)])
    return 0


# -- reading ------------------------------------------------------------------------------
def read_members(data: bytes) -> tuple[list[bytes], bool]:
    """The decompressed complete gzip members of a segment's bytes, and whether a truncated
    (or damaged) tail was left out."""
    out, pos = [], 0
    while pos < len(data):
        z = zlib.decompressobj(31)
        try:
            body = z.decompress(data[pos:])
        except zlib.error:
            return out, True
        if not z.eof:
            return out, True
        out.append(body)
        pos = len(data) - len(z.unused_data)
    return out, False


def read_segment(path: str | os.PathLike) -> tuple[bytes, bool]:
    """(the lines of every complete member, truncated tail?)"""
    members, cut = read_members(Path(path).read_bytes())
    return b"".join(members), cut


@dataclass
class RawStream:
    stream: str
    pod: str | None
    segments: list[Path]  # in write order


def scan(root: str | os.PathLike, run: str) -> list[RawStream]:
    """The streams kept for `run` under `root` (DIR of `follow --raw DIR`), by directory."""
    base = inside(root, run)
    if not base.is_dir():
        return []
    streams = []
    for folder in sorted(p for p in base.iterdir() if p.is_dir()):
        segs = sorted((p for p in folder.iterdir() if _seq(p.name)), key=lambda p: _seq(p.name))
        if not segs:
            continue
        key, pod = stream_of_dir(folder.name), None
        try:
            meta = json.loads((folder / META).read_text())
            key, pod = meta.get("stream", key), meta.get("pod")
        except (OSError, ValueError):
            pass
        streams.append(RawStream(key, pod, segs))
    return streams


def iter_lines(stream: RawStream) -> Iterator[bytes]:
    for seg in stream.segments:
        data, _ = read_segment(seg)
        yield from data.splitlines(keepends=True)
