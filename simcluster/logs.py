"""Container logs as kubelet keeps them: the files of one container instance, their
rotation, and the body of a pods/log read or follow.

Only the current file is ever served (kubelet's ReadLogs opens the current path), and a
follow whose file was rotated away stays open and silent (kubernetes #115701).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from steptail.simcluster import kube

POLL = 0.01  # seconds between two looks of an open follow for new lines


@dataclass
class Entry:
    """One line as kubelet stored it."""

    ts_ns: int
    ts: str  # RFC3339Nano, kubelet style
    text: str
    file_gen: int  # which log file (0 = first) holds it
    served: bool = False  # included in at least one API response
    key: tuple | None = None  # (incarnation, step, kind) for trainer lines
    unterminated: bool = False  # printed without its newline (the endless_line fault)

    def wire(self, timestamps: bool) -> bytes:
        """The entry as a pods/log read sends it. Text from bytes that are not UTF-8 (the
        garbage fault: surrogate escapes) is sent as those bytes."""
        text = f"{self.ts} {self.text}" if timestamps else self.text
        try:
            data = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            data = text.encode("utf-8", "replace")
        return data if self.unterminated else data + b"\n"


class ContainerLog:
    """The log files of one container instance (pod uid, container, restart count): the
    current file + up to max_files-1 rotated ones. Entries are addressed by an absolute index
    that survives the removal of old files."""

    def __init__(self, max_size: int, max_files: int) -> None:
        self.max_size = max_size
        self.max_files = max_files
        self.entries: list[Entry] = []
        self.base = 0  # absolute index of entries[0] (older files were removed)
        self.gen = 0  # current file generation
        self.file_starts = [0]  # absolute start index of each generation
        self.cur_size = 0
        self.last_ts = 0
        self.terminated = False  # container exited: follow streams end at EOF
        self.rotations = 0
        self.floods = 0  # `flood` bursts written (each different)

    @property
    def end(self) -> int:
        return self.base + len(self.entries)

    @property
    def cur_start(self) -> int:
        return self.file_starts[self.gen]

    def file_end(self, gen: int) -> int:
        return self.file_starts[gen + 1] if gen + 1 < len(self.file_starts) else self.end

    def write(self, text: str, ts_ns: int | None = None, key: tuple | None = None) -> Entry:
        ts_ns = max(ts_ns or time.time_ns(), self.last_ts)  # kubelet timestamps never go back
        self.last_ts = ts_ns
        e = Entry(ts_ns, kube.rfc3339nano(ts_ns), text, self.gen, key=key)
        self.entries.append(e)
        # CRI line: "<ts> stdout F <text>\n"
        self.cur_size += len(e.ts) + 10 + len(text.encode("utf-8", "replace")) + 1
        return e

    def get(self, idx: int) -> Entry | None:
        i = idx - self.base
        return self.entries[i] if 0 <= i < len(self.entries) else None

    def rotate(self) -> None:
        self.gen += 1
        self.file_starts.append(self.end)
        self.cur_size = 0
        self.rotations += 1
        # keep current + (max_files - 1) rotated files
        keep_from_gen = max(0, self.gen - (self.max_files - 1))
        cut = self.file_starts[keep_from_gen]
        if cut > self.base:
            del self.entries[: cut - self.base]
            self.base = cut

    def maybe_rotate(self) -> bool:
        """kubelet's containerLogMaxSize check."""
        if self.max_size > 0 and self.cur_size > self.max_size:
            self.rotate()
            return True
        return False


async def stream(request: web.Request, log: ContainerLog, lock: threading.RLock, *, gen: int, start: int,
                 follow: bool, timestamps: bool, since_ns: int | None, limit: int | None,
                 ended: Callable[[], bool]) -> web.StreamResponse:
    """Send file `gen` of `log` from index `start`: to its end, or with `follow` until the
    container terminates, `ended()` turns true (eof_streams, shutdown) or the client leaves.
    The caller picked gen and start under `lock`, so no line slips between them."""
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
    if follow:
        resp.enable_chunked_encoding()
    await resp.prepare(request)
    sent = 0
    pos = start
    try:
        while True:
            with lock:
                stop = ended()
                fend = log.file_end(gen)
                chunk = []
                while pos < fend:
                    e = log.get(pos)
                    pos += 1
                    if e is None or (since_ns is not None and e.ts_ns < since_ns):
                        continue
                    data = e.wire(timestamps)
                    if limit is not None and sent + len(data) > limit:
                        data = data[: limit - sent]
                    chunk.append(data)
                    sent += len(data)
                    e.served = True
                    if limit is not None and sent >= limit:
                        stop = True
                        break
                rotated_away = gen != log.gen and pos >= fend  # our file is no longer current
                done = log.terminated and gen == log.gen and pos >= log.end
            if chunk:
                await resp.write(b"".join(chunk))
            if stop or not follow or done:
                break
            if rotated_away:
                # kubernetes #115701: the stream stays open but never sends again
                while not ended():
                    if request.transport is None or request.transport.is_closing():
                        break
                    await asyncio.sleep(POLL * 5)
                break
            if request.transport is None or request.transport.is_closing():
                break
            await asyncio.sleep(POLL)
        await resp.write_eof()
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    return resp
