"""A stream's cursor: the mark (the stamp of the latest line read, what a re-read asks for
as `since`) and the digests of the lines read lately, so the lines a re-read serves again are
dropped before they are parsed; and a node clock's jumps, told apart from a bad stamp
(runs.model reads each stream through one)."""

from __future__ import annotations

import hashlib
import time
from collections import deque

from steptail.parsers.bounds import CLOCK_JUMP_NS
from steptail.parsers.fast import line_ts

JUMPS_KEPT = 256  # digests of clock-jumped lines a cursor remembers; beyond, such lines are bad
JUMPED = "clock:"  # prefix of those digests where the cursor is saved (cursors.at_hwm)
# A node clock stepped ahead and staying there, not one bad stamp: this many lines in a row that
# far ahead, their stamps going on together over at least JUMP_CONFIRM_NS (one stamp repeated is
# no clock). The mark then moves to them: the server filters a re-read by the node's stamps.
JUMP_CONFIRM_LINES = 8
JUMP_CONFIRM_NS = 10**9


def line_digest(line: bytes) -> str:
    return hashlib.blake2b(line, digest_size=8).hexdigest()


class ClockJump:
    """`Cursor.admit`'s answer for a new line stamped more than CLOCK_JUMP_NS behind the line
    before it, or ahead of the mark and of the wall clock. It is read as if stamped at
    `read_ns`, the line before's time (None when there is none); `tracked` False: the cursor
    could not remember it."""

    __slots__ = ("stamped_ns", "read_ns", "tracked")

    def __init__(self, stamped_ns: int, read_ns: int | None, tracked: bool = True) -> None:
        self.stamped_ns, self.read_ns, self.tracked = stamped_ns, read_ns, tracked


SECOND_NS = 10**9
# What a cursor remembers of the lines it read (digests, in log order): at most the last
# REMEMBER_LINES lines, from the oldest stamped REMEMBER_SECONDS before the mark's second or
# later: the lines a re-read from the mark serves first (see Cursor). Whether a record line was
# recorded before, however long ago, is not the cursor's to guess: the run's record identities
# tell (Identities).
REMEMBER_LINES = 20_000
REMEMBER_SECONDS = 4  # parsers/block.py and parsers/_steady.c hand the cursor as many
# A re-read starts this long before the mark: a node clock stepped back by up to this while the
# stream was down still has its new lines served (the re-read's older lines are repeats).
SINCE_MARGIN_NS = 3 * SECOND_NS
TOP = "top:"  # saved in at_hwm: the latest stamp read, when after the mark (a clock stepped back)
# saved in at_hwm of the stream that fed the last step of incarnation N ("steps:N"): a model
# resumed from the store knows it (RunModel._step_stream: a step going back on it is held)
STEPS = "steps:"
FORGOT = "forgot:"  # what older versions saved in at_hwm (the hold they had): ignored


def floor_second(ns: int) -> int:
    """What kubectl sends as --since-time for `ns`: the whole second, truncated."""
    return ns - ns % SECOND_NS


def remember_from(hwm_ns: int) -> int:
    """The oldest stamp of the lines a cursor at `hwm_ns` remembers."""
    return floor_second(hwm_ns) - REMEMBER_SECONDS * SECOND_NS


class Cursor:
    """What one stream read: the mark (the stamp of the latest line read, what the next
    re-read asks for as `since`) and the digests of the lines read lately.

    A re-read from S (kubectl truncates --since-time to the second; kubelet serves the current
    file's lines stamped >= S, in log order) first repeats lines read before, then goes on
    with new ones. A line whose digest the cursor remembers is a repeat; every other line is
    taken, whatever its stamp: stamps do go back (containerd stamps stdout and stderr apart,
    NTP steps clocks back). The cursor holds nothing back and guesses nothing: a record line
    taken that was recorded before, however long ago (a re-read reaching back past what the
    cursor remembers, a saved log holding a block twice, a file ingested again), is a repeat by
    its identity (Identities: its stamp and step, per kind), which the model checks; a noise
    line needs no exactly-once. The mark follows the latest line, back too: a re-read from an
    old mark after a clock step back would have the server filter out the new lines.

    Bound: at most REMEMBER_LINES lines, from the oldest stamped REMEMBER_SECONDS before the
    mark's second or later (remember_from). `top_ns`: the latest stamp read; after a clock
    stepped back it lies after the mark, and a re-read's line stamped between the two may be a
    line read before (collector.live.overlap.Overlap waits for a line that tells).

    A line stamped far ahead of the mark and of the wall clock (a clock jump) does not move
    the mark: one line stamped 2099 would otherwise have the server filter out every later
    line. It is remembered by digest (saved in at_hwm with the JUMPED prefix). Lines that go on
    from it (JUMP_CONFIRM_LINES in a row, their stamps advancing over JUMP_CONFIRM_NS) are the
    node's clock stepped ahead: the mark moves to them (`ahead`). A line far behind the line
    before it is a clock jump too (flagged), but the mark follows it.

    `done`: the stream was read to its end (a follower that starts again knows which streams
    of pods gone meanwhile are complete). `steps`: the incarnation whose last step this stream
    fed, saved for a model resumed from the store."""

    __slots__ = ("hwm_ns", "_recent", "_known", "last_ns", "jumped", "done", "behind_ns", "read_at_ns",
                 "top_ns", "ahead", "steps")

    def __init__(self, hwm_ns: int | None = None, at_hwm: set[str] | None = None, done: bool = False) -> None:
        self.hwm_ns = hwm_ns
        self.done = done
        self.jumped: set[str] = set()  # digests of lines taken across a clock jump
        self.steps: int | None = None
        top = hwm_ns
        entries = []
        for d in at_hwm or ():
            if d.startswith(JUMPED):
                self.jumped.add(d[len(JUMPED):])
            elif d.startswith(TOP):
                top = max(top or 0, int(d[len(TOP):]))
            elif d.startswith(STEPS):
                self.steps = int(d[len(STEPS):])
            elif d.startswith(FORGOT):
                continue
            elif ":" in d:
                ts, _, digest = d.partition(":")
                entries.append((int(ts), digest))
            elif hwm_ns is not None:  # saved before stamps were: the lines at the mark
                entries.append((hwm_ns, d))
        # Log order, as far as stamps tell: lines stamped after the mark were read before a clock
        # stepped back; the line at the mark (the last one read) last.
        entries.sort(key=lambda e: (hwm_ns is None or e[0] <= hwm_ns, e[0]))
        self._recent: deque[tuple[int, str]] = deque(entries)  # (ts_ns, digest) in log order
        self._known: dict[str, int] = {}  # digest -> how many of _recent
        for ts, d in entries:
            self._known[d] = self._known.get(d, 0) + 1
            if top is None or ts > top:
                top = ts
        self.top_ns = top
        # Time of the line before, in this read (a file, a stream): what a clock jump is
        # measured from. Not saved: a new read starts without one.
        self.last_ns: int | None = None
        # The stamp of a line the pod holds, unread, stamped before the mark (a probe's answer,
        # `seen`): the clock stepped back; the next re-read must reach back to it.
        self.behind_ns: int | None = None
        self.read_at_ns = time.time_ns()  # wall clock when the mark last moved
        self.ahead: list[tuple[int, str]] = []  # (ts, digest) of the clock-jumped lines in a row, lately

    @property
    def at_hwm(self) -> set[str]:
        """What is saved with the mark: the lines a re-read from it repeats ("ts:digest"),
        clock-jumped lines, the latest stamp read if after the mark, the incarnation whose last
        step the stream fed."""
        hwm = self.hwm_ns
        out = {JUMPED + d for d in self.jumped}
        if self.steps is not None:
            out.add(f"{STEPS}{self.steps}")
        if hwm is None:
            return out
        oldest = remember_from(hwm)
        out.update(f"{ts}:{d}" for ts, d in self._recent if ts >= oldest)
        if self.top_ns is not None and self.top_ns > hwm:
            out.add(f"{TOP}{self.top_ns}")
        return out

    def copy(self) -> Cursor:
        """A snapshot, for a batch written on another thread while reading goes on."""
        return Cursor(self.hwm_ns, self.at_hwm, self.done)

    @property
    def since_ns(self) -> int | None:
        """Where the next re-read starts (kubectl --since-time): SINCE_MARGIN_NS before the mark,
        or before an unread line the pod holds stamped earlier than that."""
        if self.hwm_ns is None:
            return None
        since = self.hwm_ns - SINCE_MARGIN_NS
        return since if self.behind_ns is None else min(since, self.behind_ns - SINCE_MARGIN_NS)

    def new_read(self) -> None:
        """The next line starts a new read (a re-read, another file): no line before it to
        measure a clock jump from."""
        self.last_ns = None

    def knows(self, line: bytes) -> bool:
        """Whether this line is one the cursor remembers reading."""
        digest = line_digest(line.rstrip(b"\r\n"))
        return digest in self._known or digest in self.jumped

    def seen(self, ts_ns: int | None, line: bytes, read_at_ns: int | None = None) -> bool:
        """Whether this line was read. A line not read stamped before the mark (the follower
        asks about the pod's newest line) is evidence the clock stepped back: the next re-read
        reaches back to it (since_ns), else the server would filter out the lines after it.
        `read_at_ns`: when the mark last moved before the pod was asked (asked beside a read)."""
        if ts_ns is None:
            return False
        if self.knows(line):
            return True
        if self.hwm_ns is not None and ts_ns < self.hwm_ns:
            # the step back happened after the last line read: its first line is stamped at most
            # the time since then before this one
            behind = ts_ns - max(0, time.time_ns() - (read_at_ns or self.read_at_ns))
            self.behind_ns = behind if self.behind_ns is None else min(self.behind_ns, behind)
        return False

    def admit(self, ts_ns: int | None, line: bytes) -> bool | ClockJump:
        """True for a new line, False for a repeat, a ClockJump (true) for a new line whose
        timestamp cannot be trusted to order it."""
        if ts_ns is None:
            return True
        digest = line_digest(line.rstrip(b"\r\n"))
        if digest in self._known or digest in self.jumped:
            return False
        hwm = self.hwm_ns
        if hwm is not None and ts_ns - hwm > CLOCK_JUMP_NS and ts_ns - time.time_ns() > CLOCK_JUMP_NS or \
                hwm is None and ts_ns - time.time_ns() > CLOCK_JUMP_NS:
            # Ahead of the mark and of the wall clock: a genuine pause (a restart after hours
            # in a queue) lands in the past, a broken clock does not.
            jump = self._jump(ts_ns, digest)
            return True if self._clock_stepped(ts_ns, digest) else jump
        self.ahead = []
        last = self.last_ns
        self.hwm_ns = self.last_ns = ts_ns
        self.behind_ns, self.read_at_ns = None, time.time_ns()
        self._remember(ts_ns, digest)
        if last is not None and last - ts_ns > CLOCK_JUMP_NS:
            # Far behind the line before: flagged, read as if stamped at it. The mark follows
            # (a clock stepped back: a re-read from the old mark would not serve the lines
            # after it; a lone bad stamp: the next line moves it back).
            return ClockJump(ts_ns, last)
        return True

    def _remember(self, ts_ns: int, digest: str) -> None:
        recent, known = self._recent, self._known
        recent.append((ts_ns, digest))
        if self.top_ns is None or ts_ns > self.top_ns:
            self.top_ns = ts_ns
        known[digest] = known.get(digest, 0) + 1
        oldest = remember_from(self.hwm_ns) if self.hwm_ns is not None else ts_ns
        while len(recent) > REMEMBER_LINES or recent[0][0] < oldest:
            _, d = recent.popleft()
            n = known.pop(d) - 1
            if n:
                known[d] = n

    def forget(self, line: bytes) -> None:
        """Forget one line read (a snapshot that must not hold it)."""
        digest = line_digest(line.rstrip(b"\r\n"))
        self.jumped.discard(digest)
        if digest in self._known:
            self._recent = deque(e for e in self._recent if e[1] != digest)
            del self._known[digest]

    def take_steady(self, last_ts: int, tail: list[bytes]) -> None:
        """A steady block taken whole (stamps rising from past the mark): `tail`, its lines
        stamped from remember_from(last_ts) on, is what the cursor remembers of it."""
        self.behind_ns, self.read_at_ns = None, time.time_ns()
        self.hwm_ns = self.last_ns = last_ts
        for line in tail:
            self._remember(line_ts(line) or last_ts, line_digest(line.rstrip(b"\r\n")))

    def _clock_stepped(self, ts_ns: int, digest: str) -> bool:
        """Whether this clock-jumped line confirms the node's clock stepped ahead (see the class):
        then the mark and the lines remembered move to the new clock, the line is read as it is."""
        ahead = self.ahead
        if ahead and ts_ns < ahead[-1][0] - JUMP_CONFIRM_NS:
            ahead.clear()  # not going on from the line before: another stamp, not one clock
        ahead.append((ts_ns, digest))
        if len(ahead) < JUMP_CONFIRM_LINES or ahead[-1][0] - ahead[0][0] < JUMP_CONFIRM_NS:
            del ahead[:-JUMPS_KEPT]
            return False
        self.hwm_ns = self.last_ns = ts_ns
        self.behind_ns, self.read_at_ns = None, time.time_ns()
        for ts, d in ahead:
            self.jumped.discard(d)
            self._remember(ts, d)
        self.ahead = []
        return True

    def _jump(self, ts_ns: int, digest: str) -> ClockJump:
        if len(self.jumped) >= JUMPS_KEPT:
            return ClockJump(ts_ns, None, tracked=False)
        self.jumped.add(digest)
        return ClockJump(ts_ns, self.last_ns if self.last_ns is not None else self.hwm_ns)


# Record kinds of Identities (the step tables, in runs.rows.STEP_TABLES order).
