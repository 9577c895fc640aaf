"""Archive files written whole or not at all: a gzip log under a temporary name (fsynced, then
renamed into place), its counts as it streams by, and atomic JSON. The compressing runs on
worker threads (zlib and hashlib release the GIL), never on the event loop."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import zlib
from dataclasses import dataclass
from pathlib import Path

from steptail.parsers.timestamps import split_timestamp
from steptail.storage.durable import fsync_path, hidden_name

LEVEL = 1  # fastest: ~8:1 on trainer logs at ~270 MB/s a core (6, the default, ~9:1 at ~100 MB/s)
HEAD = 40  # bytes of a line that hold its kubelet timestamp
TMP_MARK = ".part-"  # in temporary names: `.<name>.part-<random>` (storage.durable.hidden_name)


def tmp_name(final: Path) -> Path:
    return hidden_name(final, f"{TMP_MARK[1:]}{secrets.token_hex(4)}")


def remove_stale(folder: Path) -> int:
    """Temporary files an interrupted archive left (SIGKILL): removed; how many."""
    n = 0
    for p in folder.rglob(f".*{TMP_MARK}*"):
        p.unlink(missing_ok=True)
        n += 1
    return n


def with_path(exc: OSError, path: Path) -> OSError:
    """`exc` naming the file it is about: a write or fsync error (ENOSPC, EIO) carries no
    file name, and "No space left on device" alone does not say which disk."""
    if exc.filename is not None or exc.errno is None:
        return exc
    return type(exc)(exc.errno, exc.strerror, str(path))


def write_json(path: Path, doc: dict) -> tuple[str, int]:
    """Atomically (temporary name, fsync, rename, fsync of the folder); (sha256, bytes)."""
    data = (json.dumps(doc, indent=2, sort_keys=False) + "\n").encode()
    tmp = tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise with_path(exc, path) from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent, directory=True)
    return hashlib.sha256(data).hexdigest(), len(data)


def _ts(head: bytes) -> str | None:
    return split_timestamp(head)[1]


@dataclass
class LogStats:
    bytes: int = 0  # uncompressed
    bytes_compressed: int = 0
    lines: int = 0
    first_timestamp: str | None = None
    last_timestamp: str | None = None
    sha256: str = ""  # of the .gz file
    content_sha256: str = ""  # of the log itself: an unchanged re-read is told by it


class GzipLog:
    """One log being written: add() chunks as kubectl prints them (on a worker thread),
    finish() then commit() or abort(). Nothing appears under the final name before commit."""

    def __init__(self, final: Path) -> None:
        self.final = final
        final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = tmp_name(final)
        self._f = open(self.tmp, "wb")  # noqa: SIM115 - closed by finish/abort
        self._z = zlib.compressobj(LEVEL, zlib.DEFLATED, 31)  # 31: a gzip member, mtime 0
        self._gz, self._raw = hashlib.sha256(), hashlib.sha256()
        self.stats = LogStats()
        self._start = b""  # the log's first bytes (its first line's timestamp)
        self._last = b""  # head of the last complete line
        self._open = b""  # head of the line not ended yet

    def _out(self, data: bytes) -> None:
        if data:
            try:
                self._f.write(data)
            except OSError as exc:
                raise with_path(exc, self.final) from exc
            self._gz.update(data)
            self.stats.bytes_compressed += len(data)

    def add(self, chunk: bytes) -> None:
        st = self.stats
        if len(self._start) < HEAD:
            self._start += chunk[: HEAD - len(self._start)]
        st.bytes += len(chunk)
        self._raw.update(chunk)
        end = chunk.rfind(b"\n")
        if end >= 0:
            st.lines += chunk.count(b"\n")
            before = chunk.rfind(b"\n", 0, end)
            self._last = chunk[before + 1: before + 1 + HEAD] if before >= 0 else (self._open + chunk[:HEAD])[:HEAD]
            self._open = chunk[end + 1: end + 1 + HEAD]
        elif len(self._open) < HEAD:
            self._open += chunk[: HEAD - len(self._open)]
        self._out(self._z.compress(chunk))

    def finish(self) -> LogStats:
        """All written and fsynced under the temporary name."""
        st = self.stats
        self._out(self._z.flush())
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
        except OSError as exc:
            raise with_path(exc, self.final) from exc
        if self._open:  # a last line without its newline (cut off)
            st.lines += 1
            self._last = self._open
        st.first_timestamp, st.last_timestamp = _ts(self._start), _ts(self._last)
        st.sha256, st.content_sha256 = self._gz.hexdigest(), self._raw.hexdigest()
        return st

    def commit(self) -> None:
        os.replace(self.tmp, self.final)
        fsync_path(self.final.parent, directory=True)

    def abort(self) -> None:
        if not self._f.closed:
            try:
                self._f.close()
            except OSError:  # its buffer's flush on a full disk: the file is being thrown away
                pass
        self.tmp.unlink(missing_ok=True)
