"""Container logs as kubelet keeps them: the files of one container instance, their
rotation, and the body of a pods/log read or follow.

Only the current file is ever served (kubelet's ReadLogs opens the current path), and a
follow whose file was rotated away stays open and silent (kubernetes #115701).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from steptail.simcluster import kube

POLL = 0.01  # seconds between two looks of an open follow for new lines
_WRITES = itertools.count()  # global write order of every line of every container (truth)


@dataclass
class Entry:
    """One line as kubelet stored it."""

    ts_ns: int  # the stamp kubelet stored (node clock; may go back, see write())
    ts: str  # RFC3339Nano, kubelet style
    text: str
    file_gen: int  # which log file (0 = first) holds it
    served: bool = False  # included in at least one API response
    served_ns: int | None = None  # when a response first included it (true time)
    wall_ns: int = 0  # true time of the write (time.time_ns(), no node clock offset)
    seq: int = 0  # global write order (every container of the cluster)
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
        self.last_ts = 0  # the clamp's floor: the last stamp written on the clamped path
        self.clock_offset_ns = 0  # the node clock minus true time (clock_step)
        self.terminated = False  # container exited: follow streams end at EOF
        self.rotations = 0
        self.floods = 0  # `flood` bursts written (each different)
        self.gen_end_ns: dict[int, int] = {}  # file generation -> when it stopped being current
        self.gone_ns: int | None = None  # when the API stopped serving this container's log at all
        self.journal: list | None = None  # process 0: every line written (truth), see truth.py
        self.owner = None  # (Pod, ContainerInstance), for the journal
        self.incarnation = 0  # process 0: the trainer incarnation this container runs

    @property
    def end(self) -> int:
        return self.base + len(self.entries)

    @property
    def cur_start(self) -> int:
        return self.file_starts[self.gen]

    def file_end(self, gen: int) -> int:
        return self.file_starts[gen + 1] if gen + 1 < len(self.file_starts) else self.end

    def write(self, text: str, ts_ns: int | None = None, key: tuple | None = None, *,
              stamp_ns: int | None = None, journal: bool = True) -> Entry:
        """Append one line. `ts_ns` is the true time it was printed (default now); kubelet
        stamps it with the node clock (+ clock_offset_ns) and, by default, never before the
        last stamp (the simulator writes a step's burst with one stamp taken before its noise
        lines, the clamp keeps that in order). `stamp_ns` is an exact stamp, neither offset
        nor clamped nor moving the floor: a line of the other stream (stdout vs stderr,
        which containerd stamps separately), e.g. `stamp_skew`."""
        wall = time.time_ns()
        if stamp_ns is None:
            stamp_ns = max((ts_ns or wall) + self.clock_offset_ns, self.last_ts)
            self.last_ts = stamp_ns
        e = Entry(stamp_ns, kube.rfc3339nano(stamp_ns), text, self.gen, key=key, wall_ns=wall, seq=next(_WRITES))
        self.entries.append(e)
        if journal and self.journal is not None:
            self.journal.append((self, e))
        # CRI line: "<ts> stdout F <text>\n"
        self.cur_size += len(e.ts) + 10 + len(text.encode("utf-8", "replace")) + 1
        return e

    def get(self, idx: int) -> Entry | None:
        i = idx - self.base
        return self.entries[i] if 0 <= i < len(self.entries) else None

    def clock_step(self, delta_ns: int) -> None:
        """The node clock steps (NTP): later stamps are offset by delta_ns; a step back is not
        clamped away (the floor restarts from the stepped clock)."""
        self.clock_offset_ns += delta_ns
        self.last_ts = 0

    def servable_until(self, e: Entry) -> int | None:
        """When the API stopped serving `e` (its file rotated away, or the container's log gone),
        None while it still does."""
        ends = [t for t in (self.gen_end_ns.get(e.file_gen), self.gone_ns) if t is not None]
        return min(ends) if ends else None

    def rotate(self) -> None:
        self.gen_end_ns[self.gen] = time.time_ns()
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
                 ended: Callable[[], bool], aborted: Callable[[], bool] = lambda: False,
                 frozen: Callable[[], bool] = lambda: False) -> web.StreamResponse:
    """Send file `gen` of `log` from index `start`: to its end, or with `follow` until the
    container terminates, `ended()` turns true (eof_streams, shutdown) or the client leaves;
    `aborted()`: the connection is dropped instead of ended; while `frozen()` nothing is sent.
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
                hold = frozen() and not ended()
            if hold:
                await asyncio.sleep(POLL)
                continue
            with lock:
                stop = ended()
                fend = log.file_end(gen)
                chunk = []
                while pos < fend:
                    e = log.get(pos)
                    pos += 1
                    # kubelet filters each line (msg.timestamp.Before(since) is skipped), it does
                    # not seek: once stamps go back, lines after a skipped one are still served
                    if e is None or (since_ns is not None and e.ts_ns < since_ns):
                        continue
                    data = e.wire(timestamps)
                    if limit is not None and sent + len(data) > limit:
                        data = data[: limit - sent]
                    chunk.append(data)
                    sent += len(data)
                    if not e.served:
                        e.served, e.served_ns = True, time.time_ns()
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
        with lock:
            drop = aborted()
        if drop:  # a reset: no final chunk
            if request.transport is not None:
                request.transport.abort()
            return resp
        await resp.write_eof()
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    return resp
