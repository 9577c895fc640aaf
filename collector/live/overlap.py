"""Whether a read of a pod's log left lines unread before it: the overlap check.

A re-read must reach back to the last line read; a first read must begin at the trainer's
start-up. Pure logic on stamps and lines (the run's cursor and its record identities): the
follower feeds each line of a read to `see` and records the gaps it returns."""

from __future__ import annotations

import time

from steptail.runs.cursor import Cursor


class Overlap:
    """Decides, early in a read, whether lines before it are gone.

    A re-read (we hold a cursor) must reach back to the last line read: when its first line
    is not one read before and comes after it, the lines in between were rotated away. A line
    read before is one the cursor remembers, or a record line the run recorded (`recorded`:
    RunModel.recorded, by its identity). After a node clock stepped back, lines read before
    the step are stamped up to the cursor's `top_ns`, after the mark, and the cursor forgot
    most: a line stamped up to it that neither tells is passed over, and the first line that
    tells decides (a line read before: nothing lost; a new one: a gap from the mark to it).

    A first read starts at the beginning of the current log file: when a step line comes
    before the trainer's start-up line, the file(s) holding the start-up and the first steps
    were rotated away before following began (window: container start to that first step)."""

    ROTATED = ("log rotated between reads: the re-read starts after the last line read; lines "
               "written in between (if any) are in a rotated file and cannot be read")
    HEAD = ("the current log file begins after the trainer's start-up: earlier lines were rotated "
            "away before following began")

    def __init__(self, hwm_ns: int | None, started_ns: int | None = None, cursor: Cursor | None = None,
                 recorded=None) -> None:
        self.hwm_ns = hwm_ns
        self.cursor = cursor
        self.recorded = recorded  # (ts_ns, line) -> True/False for a record line read before or not, else None
        self.started_ns = started_ns
        self.first_ns: int | None = None
        self.resolved = False
        # the cursor's mark and when it moved, as the read began (lines passed over move them)
        self._at: tuple[int | None, int] | None = None
        self.asked = False  # would_gap said yes in this read: the container was checked

    def _mark(self) -> int | None:
        """The stamp of the last line read before this read (it starts a little before it: `hwm_ns`)."""
        if self._at is None:
            mark = self.cursor.hwm_ns if self.cursor is not None else None
            self._at = (self.hwm_ns if mark is None or self.hwm_ns is None else mark,
                        self.cursor.read_at_ns if self.cursor is not None else 0)
        return self._at[0]

    def _read_before(self, ts_ns: int, line: bytes) -> bool | None:
        """Whether a re-read's line was read before: True, False, None when it cannot tell (a
        line the cursor forgot, stamped where lines read before a clock step back lie)."""
        cursor = self.cursor
        if cursor.knows(line):
            return True
        recorded = self.recorded(ts_ns, line) if self.recorded is not None else None
        if recorded is not None:
            return recorded
        mark, top = self._mark(), cursor.top_ns
        # lines read before a clock stepped back lie up to `top`, some forgotten
        return None if top is not None and mark < top and ts_ns <= top else False

    def would_gap(self, ts_ns: int | None, line: bytes | None = None) -> bool:
        """A line stamped `ts_ns` may open a re-read gap (checked before it is fed): stamped
        after the mark, not known to be a line read before (`line`, when given), and the first
        such line of this read (the caller checks the container once a read)."""
        mark = self._mark()
        if self.resolved or self.asked or mark is None or ts_ns is None or ts_ns <= mark:
            return False
        if self.cursor is not None and line is not None and self._read_before(ts_ns, line) is True:
            return False
        self.asked = True
        return True

    def unanswered(self) -> int | None:
        """After the last read of an ended container: where its lost tail starts (the mark),
        when this re-read served no line at all, else None. A re-read serves the last line read
        while that line's file is current (it starts a little before it), so none means the file
        rotated after it, and whatever the container wrote after it went with it (chaos seed
        103: the last file rotated as the last step was written, the current one stayed empty)."""
        if self.resolved or self.hwm_ns is None or self.first_ns is not None:
            return None
        return self._mark()

    def see(self, ts_ns: int | None, line: bytes) -> list[tuple[int, int, str]]:
        """The gaps (start, end, reason) this line opens: found at most once per read."""
        if self.resolved or ts_ns is None:
            return []
        if self.first_ns is None:
            self.first_ns = ts_ns
        if self.hwm_ns is not None:
            mark = self._mark()
            cursor = self.cursor
            if cursor is None:
                self.resolved = True
                return [] if ts_ns <= mark else [(mark, ts_ns, self.ROTATED)]
            read = self._read_before(ts_ns, line)
            if read is None:
                return []  # it cannot tell: the next line may
            self.resolved = True
            if read:
                return []  # a line read before: the re-read reaches back
            cursor.seen(ts_ns, line)  # a new line stamped before the mark: the next re-read reaches back to it
            if ts_ns > mark:
                return [(mark, ts_ns, self.ROTATED)]
            # A new line stamped before the mark: the last line read is no longer served (else
            # it would come first), and the clock stepped back since it was read.
            return _stepped_back(mark, ts_ns, self._at[1], self.ROTATED)
        if b"distributed system" in line:  # the trainer's start-up line (parsers.line.TAGS)
            self.resolved = True
        elif b"LOSS-PARTS" in line or b"completed step:" in line:
            self.resolved = True
            start = self.started_ns if self.started_ns is not None else self.first_ns
            if ts_ns > start:
                return [(start, ts_ns, self.HEAD)]
            if ts_ns < start:  # stamped before its container started: the node clock stepped back
                return _stepped_back(start, ts_ns, start, self.HEAD)
        return []


def _stepped_back(after_ns: int, first_ns: int, since_ns: int, reason: str) -> list[tuple[int, int, str]]:
    """The windows of a loss across a node clock stepped back: lines written before the step are
    stamped after `after_ns` (the last line read, or the container's start) up to now; lines
    after it before `first_ns` (the first line read again), by at most the time since `since_ns`."""
    now = time.time_ns()
    why = f"{reason} (the node clock stepped back: two windows of stamps)"
    return [(after_ns, max(now, after_ns + 1), why), (first_ns - max(0, now - since_ns), first_ns, why)]
