"""The run model, shared by `ingest` and `follow`: incarnations, line dedupe and the rows
that reach the sinks.

An incarnation is one start of the trainer. A new one begins at a trainer start-up line
(once the current one has recorded a step) or when a LOSS-PARTS step goes back. Every
(run, incarnation, step) is emitted at most once: repeated lines are dropped by a
per-stream cursor over kubelet timestamps, before they are parsed."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from itertools import repeat

from parsers import (
    Checkpoint,
    ConfigParam,
    LossParts,
    Malformed,
    PodStep,
    RequiredRbf,
    TrainerStart,
    parse_message,
)
from parsers.fast import parse_fast
from parsers.line import MAX_LINE, clean
from parsers.records import to_json

BAD_SAMPLES = 5


@dataclass
class Incarnation:
    number: int
    started_ns: int | None = None
    saw_start: bool = False  # the trainer's start-up line was read (following began before step 1)
    first_step: int | None = None
    last_step: int | None = None  # last LOSS-PARTS step
    restored_from: int | None = None
    process_index: int | None = None
    process_count: int | None = None
    pod: str | None = None
    last_rbf: int | None = None
    last_pod_step: int | None = None
    config: set[str] = field(default_factory=set)

    def row(self, run: str) -> tuple:
        return (
            run, self.number, self.started_ns, self.saw_start, self.first_step, self.last_step,
            self.restored_from, self.process_index, self.process_count, self.pod,
        )


def line_digest(line: bytes) -> str:
    return hashlib.blake2b(line, digest_size=8).hexdigest()


class Cursor:
    """High-water mark of one stream's kubelet timestamps and the lines read at that instant.

    Reconnects re-read from a whole second before the last line, so every line at or before
    the mark is a repeat unless it is a line at the mark not seen yet. Digests are taken
    only when two lines share the mark or the cursor is saved (the common case hashes
    nothing)."""

    __slots__ = ("hwm_ns", "_digests", "_lines")

    def __init__(self, hwm_ns: int | None = None, at_hwm: set[str] | None = None) -> None:
        self.hwm_ns = hwm_ns
        self._digests: set[str] = set(at_hwm or ())
        self._lines: list[bytes] = []  # lines at the mark not yet digested

    @property
    def at_hwm(self) -> set[str]:
        if self._lines:
            self._digests.update(line_digest(x) for x in self._lines)
            self._lines.clear()
        return self._digests

    def seen(self, ts_ns: int | None, line: bytes) -> bool:
        """Whether `admit` would drop this line as a repeat (a question only: nothing changes)."""
        hwm = self.hwm_ns
        if ts_ns is None or hwm is None or ts_ns > hwm:
            return False
        return ts_ns < hwm or line_digest(line.rstrip(b"\r\n")) in self.at_hwm

    def admit(self, ts_ns: int | None, line: bytes) -> bool:
        if ts_ns is None:
            return True
        hwm = self.hwm_ns
        line = line.rstrip(b"\r\n")
        if hwm is None or ts_ns > hwm:
            self.hwm_ns, self._digests, self._lines = ts_ns, set(), [line]
            return True
        if ts_ns < hwm:
            return False
        digest = line_digest(line)
        if digest in self.at_hwm:
            return False
        self._digests.add(digest)
        return True


@dataclass
class Batch:
    """Rows produced since the last flush, one list of tuples per table (column order as in
    storage.sql.COLUMNS)."""

    loss_parts: list[tuple] = field(default_factory=list)
    required_rbf: list[tuple] = field(default_factory=list)
    pod_metrics: list[tuple] = field(default_factory=list)
    config: list[tuple] = field(default_factory=list)
    checkpoints: list[tuple] = field(default_factory=list)
    incarnations: dict[int, tuple] = field(default_factory=dict)
    cursors: dict[str, Cursor] = field(default_factory=dict)  # JSON columns hold JSON text
    reconnects: list[tuple] = field(default_factory=list)  # live path: streams re-opened

    def __len__(self) -> int:
        return (
            len(self.loss_parts) + len(self.required_rbf) + len(self.pod_metrics)
            + len(self.config) + len(self.checkpoints)
        )


@dataclass
class Counters:
    lines: int = 0
    loss_parts: int = 0
    required_rbf: int = 0
    pod_steps: int = 0
    bad_lines: int = 0
    duplicates: int = 0
    bad_samples: list[str] = field(default_factory=list)

    def add(self, other: Counters) -> None:
        for name in ("lines", "loss_parts", "required_rbf", "pod_steps", "bad_lines", "duplicates"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.bad_samples.extend(other.bad_samples[: BAD_SAMPLES - len(self.bad_samples)])

    def bad(self, what: str) -> None:
        self.bad_lines += 1
        if len(self.bad_samples) < BAD_SAMPLES:
            self.bad_samples.append(what[:300])


class RunModel:
    """State of one run. Feed it lines; take its rows with `take()`."""

    def __init__(
        self,
        run: str,
        current: Incarnation | None = None,
        cursors: dict[str, Cursor] | None = None,
        incarnations: int = 0,
    ) -> None:
        self.run = run
        self.current = current
        self.count = max(incarnations, current.number if current else 0)
        self.cursors = cursors or {}
        self.counters = Counters()
        self.batch = Batch()
        self.pod: str | None = None  # set by the follower: the pod now being read

    # -- input -----------------------------------------------------------------
    def feed(self, line: bytes, stream: str = "log") -> None:
        """One candidate line (any line is accepted; only tagged ones make rows)."""
        item = parse_fast(line) if len(line) <= MAX_LINE else None
        if item is None:
            self._feed_general(line, stream)
        else:
            self.feed_item(item + (line,), stream)

    def feed_item(self, item: tuple, stream: str = "log") -> None:
        """One item of parsers.block.parse_block: a fast-path tuple + line, or ("X", line)."""
        self.feed_items((item,), stream)

    def feed_items(self, items, stream: str = "log") -> None:
        """Items of parsers.block.parse_block, in order (the ingest hot loop)."""
        admit = self._cursor(stream).admit
        loss, rbf, pod = self._loss, self._rbf, self._pod
        for item in items:
            kind = item[0]
            if kind == "X":
                self._feed_general(item[1], stream)
            elif not admit(item[1], item[-1]):
                self.counters.duplicates += 1
            elif kind == "L":
                loss(item[1], item[2], item[3], item[4], item[5])
            elif kind == "R":
                rbf(item[1], item[2], item[3], item[4], item[5])
            else:
                pod(item[1], item[2], item[3], item[4], item[5], item[6], item[7], "{}")

    def feed_steady(self, block, stream: str = "log") -> bool:
        """Take a parsers.block.Steady block whole, if the run's state allows: the current
        incarnation goes on (every step above the last one recorded) and every line is past
        the cursor. False (nothing changed) when the block must be read line by line."""
        cur, cursor = self.current, self._cursor(stream)
        if cur is None:
            return False
        if block.first_ts is not None and cursor.hwm_ns is not None and block.first_ts <= cursor.hwm_ns:
            return False
        for cols, last in ((block.loss, cur.last_step), (block.rbf, cur.last_rbf),
                           (block.pod, cur.last_pod_step)):
            if cols and last is not None and cols[1][0] <= last:  # cols[1]: the steps
                return False
        run, batch, counters = self.run, self.batch, self.counters
        inc = cur.number
        if block.loss:
            ts, step, ce, ce_raw, parts = block.loss
            if cur.first_step is None:
                cur.first_step = step[0]
            cur.last_step = step[-1]
            self._touch(cur)
            ce = [None if c != c or c in (math.inf, -math.inf) else c for c in ce]
            batch.loss_parts.extend(zip(repeat(run), repeat(inc), step, ts, ce, ce_raw, parts))
            counters.loss_parts += len(step)
        if block.rbf:
            ts, step, mx, per_layer, program = block.rbf
            cur.last_rbf = step[-1]
            batch.required_rbf.extend(zip(repeat(run), repeat(inc), step, ts, mx, per_layer, program))
            counters.required_rbf += len(step)
        if block.pod:
            ts, step, seconds, tflops, tokens, weights, loss = block.pod
            cur.last_pod_step = step[-1]
            batch.pod_metrics.extend(
                zip(repeat(run), repeat(inc), step, ts, seconds, tflops, tokens, weights, loss, repeat("{}")))
            counters.pod_steps += len(step)
        batch.checkpoints.extend((run, cur.number, "save", step, ts) for ts, step in block.saves)
        if block.last_ts is not None:
            cursor.hwm_ns, cursor._digests, cursor._lines = block.last_ts, set(), list(block.lines_at_last)
        return True

    def _feed_general(self, line: bytes, stream: str) -> None:
        ts_ns, _, text = clean(line)
        if not self._cursor(stream).admit(ts_ns, line):
            self.counters.duplicates += 1
            return
        if len(line) > MAX_LINE:
            self.counters.bad(f"line of {len(line)} bytes: {text[:80]}")
            return
        record = parse_message(text)
        if record is not None:
            self.apply(record, ts_ns)

    def _cursor(self, stream: str) -> Cursor:
        cursor = self.cursors.get(stream)
        if cursor is None:
            cursor = self.cursors[stream] = Cursor()
        self.batch.cursors[stream] = cursor
        return cursor

    def bad_line(self, what: str) -> None:
        """A line the source could not deliver whole (over-long, cut off at the end)."""
        self.counters.bad(what)

    # -- the model ---------------------------------------------------------------
    def apply(self, rec, ts_ns: int | None) -> None:
        if isinstance(rec, LossParts):
            self._loss(ts_ns, rec.step, rec.ce, rec.ce_raw, rec.parts_json)
        elif isinstance(rec, RequiredRbf):
            self._rbf(ts_ns, rec.step, rec.max, rec.per_layer_json, rec.program)
        elif isinstance(rec, PodStep):
            self._pod(ts_ns, rec.step, rec.seconds, rec.tflops, rec.tokens_per_s, rec.total_weights,
                      rec.loss, to_json(rec.extra) if rec.extra else "{}")
        elif isinstance(rec, TrainerStart):
            cur = self.current
            if cur is None or cur.last_step is not None:
                cur = self._open(ts_ns)
            cur.saw_start = True
            if rec.process_count is not None:
                cur.process_index, cur.process_count = rec.process_index, rec.process_count
            self._touch(cur)
        elif isinstance(rec, ConfigParam):
            cur = self._ensure(ts_ns)
            if rec.name not in cur.config:
                cur.config.add(rec.name)
                self.batch.config.append((self.run, cur.number, rec.name, rec.value))
        elif isinstance(rec, Checkpoint):
            cur = self._ensure(ts_ns)
            if rec.kind == "restore":
                cur.restored_from = rec.step
                self._touch(cur)
            self.batch.checkpoints.append((self.run, cur.number, rec.kind, rec.step, ts_ns))
        elif isinstance(rec, Malformed):
            self.counters.bad(f"{rec.tag}: {rec.reason}: {rec.text}")

    def _loss(self, ts_ns, step, ce, ce_raw, parts_json) -> None:
        cur = self.current
        if cur is None or (cur.last_step is not None and step <= cur.last_step):
            cur = self._open(ts_ns)
        if cur.first_step is None:
            cur.first_step = step
            self._touch(cur)
        cur.last_step = step
        self.batch.incarnations[cur.number] = cur
        if ce != ce or ce in (math.inf, -math.inf):  # nan or inf: stored as NULL, ce_raw says which
            ce = None
        self.batch.loss_parts.append((self.run, cur.number, step, ts_ns, ce, ce_raw, parts_json))
        self.counters.loss_parts += 1

    def _rbf(self, ts_ns, step, mx, per_layer_json, program) -> None:
        cur = self.current if self.current is not None else self._open(ts_ns)
        if cur.last_rbf is not None and step <= cur.last_rbf:
            self.counters.duplicates += 1
            return
        cur.last_rbf = step
        self.batch.required_rbf.append((self.run, cur.number, step, ts_ns, mx, per_layer_json, program))
        self.counters.required_rbf += 1

    def _pod(self, ts_ns, step, seconds, tflops, tokens, total_weights, loss, extra_json) -> None:
        cur = self.current if self.current is not None else self._open(ts_ns)
        if cur.last_pod_step is not None and step <= cur.last_pod_step:
            self.counters.duplicates += 1
            return
        cur.last_pod_step = step
        self.batch.pod_metrics.append(
            (self.run, cur.number, step, ts_ns, seconds, tflops, tokens, total_weights, loss, extra_json)
        )
        self.counters.pod_steps += 1

    def _ensure(self, ts_ns: int | None) -> Incarnation:
        return self.current if self.current is not None else self._open(ts_ns)

    def _open(self, ts_ns: int | None) -> Incarnation:
        self.count += 1
        self.current = Incarnation(self.count, started_ns=ts_ns, pod=self.pod)
        self._touch(self.current)
        return self.current

    def _touch(self, inc: Incarnation) -> None:
        self.batch.incarnations[inc.number] = inc  # rendered to a row at take()

    # -- output ----------------------------------------------------------------
    def take(self) -> Batch:
        """The rows produced since the last call; incarnation rows rendered now."""
        batch, self.batch = self.batch, Batch()
        batch.incarnations = {n: inc.row(self.run) for n, inc in batch.incarnations.items()}
        # Snapshots: the batch may be written by another thread while reading goes on.
        batch.cursors = {k: Cursor(c.hwm_ns, set(c.at_hwm)) for k, c in batch.cursors.items()}
        return batch
