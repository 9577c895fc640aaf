"""The run model, shared by `ingest` and `follow`: incarnations, line dedupe and the rows
that reach the sinks.

An incarnation is one start of the trainer. A new one begins at a trainer start-up line
(once the current one has recorded a step), or when a LOSS-PARTS step goes back after a
restore line or on a new stream; a step going back without such evidence is held until the
next step decides (RunModel._decide). Every (run, incarnation, step) is emitted at most once,
and every record line at most once: a record line whose kubelet stamp and step were recorded
for the run is a repeat however long ago (runs.identities, filled from the store's rows on a
resume); a replay is an earlier step with a new stamp. A per-stream cursor (runs.cursor) drops the
lines of the last seconds read again, before they are parsed, and holds nothing back.

One line cannot cost the others: a step that jumps absurdly is flagged (`step_jump`) and
quarantined, not recorded nor taken for a restart; a timestamp far from the line before it is
flagged (`clock_jump`) and never moves the cursor."""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from dataclasses import dataclass, field, replace
from itertools import repeat

from steptail.parsers import (
    Checkpoint,
    ConfigParam,
    LossParts,
    Malformed,
    PodStep,
    RequiredRbf,
    TrainerStart,
    format_ns,
    parse_message,
)
from steptail.parsers.bounds import CLOCK_JUMP_NS, INT32_MAX, int32, int64
from steptail.parsers.fast import (
    ITEM_KIND,
    ITEM_LINE,
    ITEM_STEP,
    ITEM_TS,
    ROW_STEP,
    ROW_TS,
    line_ts,
    parse_stamped,
)
from steptail.parsers.line import MAX_LINE, message
from steptail.parsers.numbers import parse_unsigned
from steptail.parsers.records import ItemKind, to_json
from steptail.runs.cursor import JUMPS_KEPT, ClockJump, Cursor, line_digest
from steptail.runs.findings import (  # NO_STEP: a flag not tied to a step
    CLOCK_JUMP,
    NO_STEP,
    STEP_JUMP,
)
from steptail.runs.identities import KIND_OF, LOSS, MAX_HOLE, POD, RBF, Identities
from steptail.runs.rows import INCARNATION, ROW_TABLES, RUN, TABLES

BAD_SAMPLES = 5
# Findings the model raises while reading lines (ingest or follow); the stored rows do not show
# them, so `check` keeps the stored ones.
FLAG_KINDS = frozenset({STEP_JUMP, CLOCK_JUMP})
# A step is absurd when it passes the run's configured `steps`, or is more than STEP_JUMP_FACTOR
# times the step before it and more than STEP_JUMP_MIN above it (a corrupted number, not a
# resume: a resume goes back, and is a new incarnation).
STEP_JUMP_FACTOR = 1000
STEP_JUMP_MIN = 10**6
# Steps ahead of the last, in less time than 1/SPEED_LIMIT of the run's median step would take
# them: a lone line, not a gap (a gap's steps were run, and took their time). Far above any real
# speed-up (the simulator's rates span 1000x): an odd line is printed within its step's burst.
SPEED_LIMIT = 10_000
TOO_FAST = ", sooner than the steps between could run"
# A followed pod's stream key (collector.live.follower.stream_key): pod uid/container/restart count.
# Two such keys are two container instances, so two starts of the trainer.
POD_STREAM = re.compile(r"[0-9a-f-]{8,}/[^/]+/\d+")


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
    # what it ran on, from the cluster (live path): the pod's image, the digest the kubelet
    # ran, the slice topology and the JobSet's host count (which image produced which steps)
    image: str | None = None
    image_id: str | None = None
    topology: str | None = None
    hosts: int | None = None
    container_started_ns: int | None = None  # its container's startedAt (goodput's queued_s)

    def row(self, run: str) -> tuple:
        """In rows.INCARNATIONS order."""
        return (
            run, self.number, self.started_ns, self.saw_start, self.first_step, self.last_step,
            self.restored_from, self.process_index, self.process_count, self.pod,
            self.image, self.image_id, self.topology, self.hosts, self.container_started_ns,
        )


@dataclass
class _Pending:
    """A LOSS-PARTS step going back with no evidence of a restart, and the REQUIRED_RBF and pod
    lines of its steps read after it (function, arguments), until the next step decides; or
    (`ahead`) a step skipping steps sooner than they could run (_soon)."""

    ts_ns: int | None
    step: int
    ce: float
    ce_raw: str
    parts_json: str
    line: bytes | None
    held: list = field(default_factory=list)
    stream: str = "log"
    cursor: Cursor | None = None
    ahead: bool = False


@dataclass
class Batch:
    """Rows produced since the last flush, one list of tuples per table (column order:
    runs.rows.COLUMNS)."""

    loss_parts: list[tuple] = field(default_factory=list)
    required_rbf: list[tuple] = field(default_factory=list)
    pod_metrics: list[tuple] = field(default_factory=list)
    config: list[tuple] = field(default_factory=list)
    checkpoints: list[tuple] = field(default_factory=list)
    incarnations: dict[int, tuple] = field(default_factory=dict)
    cursors: dict[str, Cursor] = field(default_factory=dict)  # JSON columns hold JSON text
    reconnects: list[tuple] = field(default_factory=list)  # live path: streams re-opened
    # Lines flagged by the model, as findings rows (rows.FLAGS), and rows kept out of their
    # table (rows.QUARANTINE).
    flags: list[tuple] = field(default_factory=list)
    quarantine: list[tuple] = field(default_factory=list)

    def __len__(self) -> int:
        return (
            len(self.loss_parts) + len(self.required_rbf) + len(self.pod_metrics)
            + len(self.config) + len(self.checkpoints)
        )

    def without(self, rows) -> Batch:
        """A copy without these rows (the same tuple objects: e.g. those a store refused)."""
        drop = {id(r) for r in rows}
        kept = {t: [r for r in getattr(self, t) if id(r) not in drop] for t in ROW_TABLES}
        kept["incarnations"] = {n: r for n, r in self.incarnations.items() if id(r) not in drop}
        return replace(self, **kept)


@dataclass
class Counters:
    lines: int = 0
    loss_parts: int = 0
    required_rbf: int = 0
    pod_steps: int = 0
    bad_lines: int = 0
    duplicates: int = 0
    flagged: int = 0  # lines taken apart as step or clock jumps (findings say which)
    bad_samples: list[str] = field(default_factory=list)

    def add(self, other: Counters) -> None:
        for name in ("lines", "loss_parts", "required_rbf", "pod_steps", "bad_lines", "duplicates", "flagged"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.bad_samples.extend(other.bad_samples[: BAD_SAMPLES - len(self.bad_samples)])

    def bad(self, what: str) -> None:
        self.bad_lines += 1
        if len(self.bad_samples) < BAD_SAMPLES:
            self.bad_samples.append(printable(what[:300]))


def printable(text: str) -> str:
    """Text any store takes (PostgreSQL text and JSONB refuse NUL)."""
    return text.replace("\x00", "\\x00") if "\x00" in text else text


def _text(line: bytes | str) -> str:
    """A line as quoted in a finding or a bad-line sample."""
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    return printable(text.rstrip("\r\n")[:300])


def planned_steps(value: str) -> int | None:
    """The run's length from `Config param steps: N` (None unless a positive 32-bit integer)."""
    steps = parse_unsigned(value.strip())  # the log's number grammar: int() takes `١٥٠٠`, `+1500`
    return steps if steps is not None and 0 < steps <= INT32_MAX else None


BAD_LINE = "bad_line"  # quarantine.kind of a bad line's identity (Identities.bad)


def bad_line_digest(ts_ns: int, line: bytes) -> str:
    """A bad line's identity in the quarantine table: its kubelet stamp and its text."""
    return hashlib.blake2b(f"{BAD_LINE}\n{ts_ns}\n".encode() + line.rstrip(b"\r\n"), digest_size=16).hexdigest()


def bad_line_row(run: str, inc: int | None, ts_ns: int, line: bytes, reason: str, digest: str) -> tuple:
    """A bad line as a quarantine row (rows.QUARANTINE order): its reason and its first 300
    characters as JSON; no step."""
    data = json.dumps({"line": _text(line)}, ensure_ascii=True)
    return (run, BAD_LINE, inc, None, ts_ns if int64(ts_ns) else None, printable(reason)[:2000], data, digest,
            time.time_ns())


def quarantine_row(table: str, row: tuple, reason: str) -> tuple:
    """A row kept out of `table`, with why, in rows.QUARANTINE order. Made of what any store
    takes: the row as ASCII JSON text (NUL escaped), numbers only in range."""
    columns = TABLES.get(table)
    step_at, ts_at = getattr(columns, "STEP", None), getattr(columns, "TS_NS", None)
    data = json.dumps(row, default=repr)
    digest = hashlib.blake2b(f"{table}\n{data}".encode(), digest_size=16).hexdigest()
    inc = row[INCARNATION] if isinstance(row[INCARNATION], int) and int32(row[INCARNATION]) else None
    step = row[step_at] if step_at is not None and isinstance(row[step_at], int) and int64(row[step_at]) else None
    ts = row[ts_at] if ts_at is not None and isinstance(row[ts_at], int) and int64(row[ts_at]) else None
    return (str(row[RUN]), table, inc, step, ts, printable(reason)[:2000], data, digest, time.time_ns())


class RunModel:
    """State of one run. Feed it lines; take its rows with `take()`."""

    def __init__(
        self,
        run: str,
        current: Incarnation | None = None,
        cursors: dict[str, Cursor] | None = None,
        incarnations: int = 0,
        planned_steps: int | None = None,
        identities: Identities | None = None,
        step_stream: str | None = None,
        prior_step: int | None = None,
    ) -> None:
        """A model resumed from the store (storage.sql.load_model) gets what the store holds:
        the current incarnation, the cursors, the run's record identities, the stream of the
        last step and the last step of the incarnation before."""
        self.run = run
        self.current = current
        self.count = max(incarnations, current.number if current else 0)
        self.cursors = cursors or {}
        self.counters = Counters()
        self.batch = Batch()
        self.pod: str | None = None  # set by the follower: the pod now being read
        # set by the follower: what each pod runs on (image, image_id, topology, hosts), copied
        # into the incarnation its lines open
        self.pod_facts: dict[str, dict] = {}
        self.planned_steps = planned_steps  # the latest `Config param steps:`, if positive
        self._prior_step = prior_step  # last LOSS-PARTS step of the incarnation before
        self._stream = "log"  # the stream being fed
        self._step_stream = step_stream  # the stream of the current incarnation's last step
        self.ids = identities if identities is not None else Identities()  # what was recorded
        self._evidence = False  # a restore line since the last step: a step going back is a restart
        self._pending: _Pending | None = None  # a step going back without evidence, undecided

    # -- input -----------------------------------------------------------------
    def feed(self, line: bytes, stream: str = "log") -> None:
        """One candidate line (any line is accepted; only tagged ones make rows)."""
        self.feed_stamped(line, line_ts(line), stream)

    def feed_stamped(self, line: bytes, ts_ns: int | None, stream: str = "log") -> None:
        """`feed` for a line whose kubelet timestamp the caller read already (parsers.fast.
        line_ts): the follower reads it once, for its own checks and for the model."""
        item = parse_stamped(line, ts_ns) if len(line) <= MAX_LINE else None
        if item is None:
            self._feed_general(line, ts_ns, stream)
        else:
            self.feed_item(item + (line,), stream)

    def feed_item(self, item: tuple, stream: str = "log") -> None:
        """One item of parsers.block.parse_block: a fast-path tuple + line, or
        (ItemKind.GENERAL, line)."""
        self.feed_items((item,), stream)

    def feed_items(self, items, stream: str = "log") -> None:
        """Items of parsers.block.parse_block, in order (the ingest hot loop). An item is
        (kind, ts_ns, step, the record's fields, line) or (ItemKind.GENERAL, line)."""
        self._stream = stream
        cursor = self._cursor(stream)
        admit = cursor.admit
        loss, rbf, pod = self._loss, self._rbf, self._pod
        general, loss_kind, rbf_kind = ItemKind.GENERAL, ItemKind.LOSS, ItemKind.RBF
        kind_at, ts_at, line_at = ITEM_KIND, ITEM_TS, ITEM_LINE
        for item in items:
            kind, line = item[kind_at], item[line_at]
            if kind == general:
                self._feed_general(line, line_ts(line), stream)
                continue
            fresh = admit(item[ts_at], line)
            if fresh is not True:
                if fresh:
                    self._feed_jumped(item, fresh)
                else:
                    self.counters.duplicates += 1
            elif kind == loss_kind:  # unpacked, not item[1:] star-called: this loop is hot
                _, ts_ns, step, ce, ce_raw, parts_json, _ = item
                loss(ts_ns, step, ce, ce_raw, parts_json, line)
            elif kind == rbf_kind:
                _, ts_ns, step, mx, per_layer_json, program, _ = item
                rbf(ts_ns, step, mx, per_layer_json, program, line)
            else:
                _, ts_ns, step, seconds, tflops, tokens, total_weights, loss_value, _ = item
                pod(ts_ns, step, seconds, tflops, tokens, total_weights, loss_value, line)

    def _feed_jumped(self, item: tuple, jump: ClockJump) -> None:
        """A fast-path item across a clock jump: read as if stamped at the line before, flagged.
        (An item's fields after its ts_ns are the _loss/_rbf/_pod arguments after theirs.)"""
        kind, step = item[ITEM_KIND], item[ITEM_STEP]
        if self.ids.known(KIND_OF[kind], step, jump.stamped_ns) or \
                jump.read_ns is not None and self.ids.known(KIND_OF[kind], step, jump.read_ns):
            self.counters.duplicates += 1  # recorded before (as stamped, or as read then): no jump
            return
        if not jump.tracked:
            self._untracked_jump(jump, item[ITEM_LINE])
            return
        read_as = (jump.read_ns, *item[ITEM_STEP:])
        if kind == ItemKind.LOSS:
            self._loss(*read_as)
        elif kind == ItemKind.RBF:
            self._rbf(*read_as)
        else:
            self._pod(*read_as)
        self._clock_jump(jump, item[ITEM_STEP], item[ITEM_LINE])

    def feed_steady(self, block, stream: str = "log") -> bool:
        """Take a parsers.block.Steady block whole, if the run's state allows: the current
        incarnation goes on (every step above the last one recorded) and every line is past
        the cursor. False (nothing changed) when the block must be read line by line."""
        cur, cursor = self.current, self._cursor(stream)
        if cur is None:
            return False
        first, hwm = block.first_ts, cursor.hwm_ns
        if self._pending is not None:
            return False  # a step held back: the lines decide
        if block.loss and stream != self._step_stream and cur.last_step is not None:
            self._stream = stream
            if self._other_container():
                return False  # another container's steps: a new incarnation, line by line
        ids = self.ids
        if first is not None:
            if hwm is not None and first <= hwm:
                return False  # stamps going back at its start (a re-read, a repeat, a clock step): the lines decide
            if (hwm is None or first - hwm > CLOCK_JUMP_NS) and first - time.time_ns() > CLOCK_JUMP_NS:
                return False  # a clock jump: the scan refuses them inside a block, this is its first line
            if ids.top_ns is not None and first <= ids.top_ns and (
                    any(ids.any_known(kind, cols[ROW_STEP], cols[ROW_TS])
                        for kind, cols in ((LOSS, block.loss), (RBF, block.rbf), (POD, block.pod)) if cols)
                    or any(ids.marked(("save", step, ts)) for ts, step in block.saves)):
                return False  # it repeats records: the lines decide, each by its identity
        planned = self.planned_steps
        for cols, last in ((block.loss, cur.last_step), (block.rbf, cur.last_rbf),
                           (block.pod, cur.last_pod_step)):
            if not cols:
                continue
            steps = cols[ROW_STEP]
            if last is not None and steps[0] <= last:
                return False
            if (last is not None and steps[0] != last + 1) or steps[-1] - steps[0] != len(steps) - 1:
                return False  # steps skipped: a gap, or a lone line ahead (_too_fast), the lines decide
            # Steps rise inside a block: no span above STEP_JUMP_MIN, no absurd jump in it; past
            # the configured steps, only one step at a time (what _absurd lets through).
            ref = self._step_ref(cur, last)
            if steps[-1] - (steps[0] if ref is None else ref) > STEP_JUMP_MIN:
                return False
            if planned is not None and steps[-1] > planned and not (
                    steps[-1] - steps[0] == len(steps) - 1
                    and (steps[0] <= planned or (ref is not None and steps[0] <= ref + 1))):
                return False
        run, batch, counters = self.run, self.batch, self.counters
        inc = cur.number
        # Rows in runs.rows.COLUMNS order, as _loss, _rbf and _pod make them (tests/test_rows.py).
        if block.loss:
            ts, step, ce, ce_raw, parts = block.loss
            if cur.first_step is None:
                cur.first_step = step[0]
            cur.last_step = step[-1]
            self._evidence, self._step_stream = False, stream
            self._touch(cur)
            ce = [None if c != c or c in (math.inf, -math.inf) else c for c in ce]
            batch.loss_parts.extend(zip(repeat(run), repeat(inc), step, ts, ce, ce_raw, parts))
            counters.loss_parts += len(step)
            ids.extend(LOSS, inc, step, ts)
        if block.rbf:
            ts, step, mx, per_layer, program = block.rbf
            cur.last_rbf = step[-1]
            batch.required_rbf.extend(zip(repeat(run), repeat(inc), step, ts, mx, per_layer, program))
            counters.required_rbf += len(step)
            ids.extend(RBF, inc, step, ts)
        if block.pod:
            ts, step, seconds, tflops, tokens, weights, loss = block.pod
            cur.last_pod_step = step[-1]
            batch.pod_metrics.extend(
                zip(repeat(run), repeat(inc), step, ts, seconds, tflops, tokens, weights, loss, repeat("{}")))
            counters.pod_steps += len(step)
            ids.extend(POD, inc, step, ts)
        batch.checkpoints.extend((run, cur.number, "save", step, ts) for ts, step in block.saves)
        for ts, step in block.saves:
            if ts is not None:
                ids.mark(("save", step, ts))
        if block.last_ts is not None:
            cursor.take_steady(block.last_ts, block.last_seconds)
        return True

    def _feed_general(self, line: bytes, ts_ns: int | None, stream: str) -> None:
        self._stream = stream
        cursor = self._cursor(stream)
        fresh = cursor.admit(ts_ns, line)
        if not fresh:
            self.counters.duplicates += 1
            return
        if len(line) > MAX_LINE:
            self._bad_line(ts_ns, line, f"line of {len(line)} bytes: {message(line, ts_ns is not None)[:80]}")
            return
        record = parse_message(message(line, ts_ns is not None))
        if fresh is not True and record is not None and (
                self._read_before(record, ts_ns, line)
                or fresh.read_ns is not None and self._read_before(record, fresh.read_ns, line)):
            self.counters.duplicates += 1  # recorded before (as stamped, or as read then): no jump
            return
        if fresh is not True and not fresh.tracked:
            self._untracked_jump(fresh, line)
            return
        if record is None:
            return
        self.apply(record, ts_ns if fresh is True else fresh.read_ns, line)
        if fresh is not True and not isinstance(record, Malformed):
            self._clock_jump(fresh, getattr(record, "step", NO_STEP), line)

    def _read_before(self, record, ts_ns: int | None, line: bytes | None = None) -> bool:
        """Whether this record's line was read before (its identity is known)."""
        if ts_ns is None:
            return False
        if isinstance(record, LossParts):
            return self.ids.known(LOSS, record.step, ts_ns)
        if isinstance(record, RequiredRbf):
            return self.ids.known(RBF, record.step, ts_ns)
        if isinstance(record, PodStep):
            return self.ids.known(POD, record.step, ts_ns)
        if isinstance(record, TrainerStart):
            return self.ids.start_repeat(ts_ns, None if line is None else line_digest(line.rstrip(b"\r\n")))
        if isinstance(record, ConfigParam):
            return self.ids.start_repeat(ts_ns)
        if isinstance(record, Checkpoint):
            return self.ids.marked((record.kind, record.step, ts_ns))
        return False

    def recorded(self, ts_ns: int | None, line: bytes) -> bool | None:
        """Whether `line` is a record line (or a start-up or checkpoint line) read before, by
        its identity; None for any other line (noise: nothing tells). For the follower's
        overlap check (collector.live.overlap.Overlap)."""
        if ts_ns is None or len(line) > MAX_LINE:
            return None
        item = parse_stamped(line, ts_ns)
        if item is not None:
            return self.ids.known(KIND_OF[item[ITEM_KIND]], item[ITEM_STEP], ts_ns)
        record = parse_message(message(line, True))
        if not isinstance(record, (LossParts, RequiredRbf, PodStep, TrainerStart, Checkpoint)):
            return None
        return self._read_before(record, ts_ns, line)

    def _clock_jump(self, jump: ClockJump, step: int, line: bytes) -> None:
        """Flag a line taken across a clock jump (its record is already applied)."""
        ref = jump.read_ns
        if ref is None:
            where = "with no line before it"
        else:
            hours = (jump.stamped_ns - ref) / 3.6e12
            span = f"{abs(hours):.1f} h" if abs(hours) < 48 else f"{abs(hours) / 24:.0f} days"
            where = f"{span} {'after' if hours > 0 else 'before'} the line before it ({format_ns(ref)})"
        self._flag(CLOCK_JUMP, step, f"a line stamped {format_ns(jump.stamped_ns)}, {where}: read in "
                   f"log order, the cursor not moved by it; line: {_text(line)}")

    def _untracked_jump(self, jump: ClockJump, line: bytes) -> None:
        self._bad_line(jump.stamped_ns, line, f"stamped {format_ns(jump.stamped_ns)}, far from the line before it "
                       f"(more such lines than a cursor remembers: {JUMPS_KEPT}): {_text(line)}")

    def _bad_line(self, ts_ns: int | None, line: bytes | None, what: str) -> None:
        """A line counted bad and skipped, once by its identity (its stamp and digest, as a
        record line is known by its stamp and step): the identity is kept in the quarantine
        table (kind `bad_line`, its reason and text), so a saved log ingested again, or a
        re-read reaching back past the cursor's memory, counts it as a duplicate, not again.
        A line without a stamp has no identity (an unstamped file is deduplicated whole)."""
        if ts_ns is not None and line is not None:
            digest = bad_line_digest(ts_ns, line)
            if self.ids.bad(digest, ts_ns):
                self.counters.duplicates += 1
                return
            inc = self.current.number if self.current is not None else None
            self.batch.quarantine.append(bad_line_row(self.run, inc, ts_ns, line, what, digest))
        self.counters.bad(what)

    def _flag(self, kind: str, step: int, detail: str) -> None:
        inc = self.current.number if self.current is not None else 0
        self.batch.flags.append((self.run, kind, inc, step, step, printable(detail), "warning", time.time_ns()))
        self.counters.flagged += 1

    def new_read(self, stream: str = "log") -> None:
        """The stream's next line opens a new read (another file): see Cursor.new_read."""
        cursor = self.cursors.get(stream)
        if cursor is not None:
            cursor.new_read()

    def finish_stream(self, stream: str) -> None:
        """The stream was read to its end: saved with the next batch."""
        self._cursor(stream).done = True

    def _cursor(self, stream: str) -> Cursor:
        cursor = self.cursors.get(stream)
        if cursor is None:
            cursor = self.cursors[stream] = Cursor()
        self.batch.cursors[stream] = cursor
        return cursor

    def bad_line(self, what: str) -> None:
        """A line the source could not deliver whole (over-long, cut off at the end)."""
        self.counters.bad(what)

    # -- the model: rows in runs.rows.COLUMNS order (tests/test_rows.py) -----------------
    def apply(self, rec, ts_ns: int | None, line: bytes | None = None) -> None:
        """One parsed record; `line` (its text) is quoted if the record is flagged."""
        if isinstance(rec, LossParts):
            self._loss(ts_ns, rec.step, rec.ce, rec.ce_raw, rec.parts_json, line)
        elif isinstance(rec, RequiredRbf):
            self._rbf(ts_ns, rec.step, rec.max, rec.per_layer_json, rec.program, line)
        elif isinstance(rec, PodStep):
            self._pod(ts_ns, rec.step, rec.seconds, rec.tflops, rec.tokens_per_s, rec.total_weights,
                      rec.loss, line, to_json(rec.extra) if rec.extra else "{}")
        elif isinstance(rec, TrainerStart):
            digest = None if line is None else line_digest(line.rstrip(b"\r\n"))
            if ts_ns is not None and self.ids.start_repeat(ts_ns, digest):
                self.counters.duplicates += 1  # read before: it opens nothing
                return
            if self._late_head(ts_ns):  # this incarnation's own start-up, read after its steps
                if digest is not None:
                    self.ids.mark(("start", digest, ts_ns))
                return
            self.settle()  # a step held back before a start-up line: no steps continued from it
            cur = self.current
            if cur is None or cur.last_step is not None:
                cur = self._open(ts_ns)
            cur.saw_start = True
            if ts_ns is not None and digest is not None:
                self.ids.mark(("start", digest, ts_ns))
                if cur.started_ns is not None:
                    self.ids.starts.setdefault(cur.number, cur.started_ns)
            if rec.process_count is not None:
                cur.process_index, cur.process_count = rec.process_index, rec.process_count
            self._touch(cur)
        elif isinstance(rec, ConfigParam):
            if ts_ns is not None and self.ids.start_repeat(ts_ns):
                self.counters.duplicates += 1  # a recorded incarnation's start-up, read again
                return
            cur = self._ensure(ts_ns)
            if rec.name == "steps":
                self.planned_steps = planned_steps(rec.value)
            if rec.name not in cur.config:
                cur.config.add(rec.name)
                self.batch.config.append((self.run, cur.number, rec.name, rec.value))
        elif isinstance(rec, Checkpoint):
            if ts_ns is not None:
                key = (rec.kind, rec.step, ts_ns)
                if self.ids.marked(key):
                    self.counters.duplicates += 1  # read before: no evidence of a restart, no row
                    return
                self.ids.mark(key)
            cur = self._ensure(ts_ns)
            if rec.kind == "restore" and self._late_head(ts_ns):
                if cur.restored_from is None:  # its own restore, read late: no evidence of a restart
                    cur.restored_from = rec.step
                    self._touch(cur)
            elif rec.kind == "restore":
                self.settle()
                self._evidence = True
                cur.restored_from = rec.step
                self._touch(cur)
            self.batch.checkpoints.append((self.run, cur.number, rec.kind, rec.step, ts_ns))
        elif isinstance(rec, Malformed):
            self._bad_line(ts_ns, line, f"{rec.tag}: {rec.reason}: {rec.text}")

    def _loss(self, ts_ns, step, ce, ce_raw, parts_json, line=None) -> None:
        ids = self.ids
        if ts_ns is not None and ids.top_ns is not None and ts_ns <= ids.top_ns and ids.known(LOSS, step, ts_ns):
            self.counters.duplicates += 1  # recorded before, however long ago: a repeat, never a replay
            return
        if self._pending is not None:
            self._decide(step)
        cur, planned = self.current, self.planned_steps
        last = None if cur is None else cur.last_step
        # _absurd's quick answer inline: this runs for every line the steady scan refused
        if (last is None or step > last + STEP_JUMP_MIN or (planned is not None and step > planned)) and \
                self._absurd(step, cur, last):
            self._step_jump("loss_parts", (self.run, cur.number if cur else 0, step, ts_ns, ce, ce_raw, parts_json),
                            cur, last, line)
            return
        if cur is not None and self._too_fast(LOSS, cur, last, step, ts_ns):
            self._step_jump("loss_parts", (self.run, cur.number, step, ts_ns, ce, ce_raw, parts_json), cur, last,
                            line, TOO_FAST)
            return
        if cur is not None and last is not None and step > last + 1 and not self._evidence and \
                self._stream == self._step_stream and self._soon(cur, last, step, ts_ns):
            self._hold(_Pending(ts_ns, step, ce, ce_raw, parts_json, line, ahead=True))
            return
        if cur is not None and cur.last_step is not None:
            if step <= cur.last_step:
                if not self._evidence and self._stream == self._step_stream:
                    if self._late(LOSS, cur, cur.last_step, step, ts_ns):
                        self._record_loss(cur, ts_ns, step, ce, ce_raw, parts_json)
                        return
                    self._hold(_Pending(ts_ns, step, ce, ce_raw, parts_json, line))
                    return
                cur = None
            elif self._stream != self._step_stream and self._other_container():
                cur = None
        if cur is None:
            cur = self._open(ts_ns)
        self._evidence, self._step_stream = False, self._stream
        if cur.first_step is None:
            cur.first_step = step
            self._touch(cur)
        cur.last_step = step
        self._record_loss(cur, ts_ns, step, ce, ce_raw, parts_json)

    def _soon(self, cur: Incarnation, last: int, step: int, ts_ns: int | None) -> bool:
        """Whether LOSS-PARTS `step`, skipping steps after `last`, came sooner than the steps it
        skips take at the run's pace: a lone line a few steps ahead (half a step after step 50,
        step 53) or a run that sped up after a gap — the next step tells (_decide). Steps lost
        to a rotation were run and took their time: not held. Without stamps, not judged."""
        stamps = self.ids.kinds[LOSS].get(cur.number)
        since = None if stamps is None or ts_ns is None else stamps.stamp(last)
        step_ns = None if since is None else stamps.step_ns(last)
        return bool(step_ns) and 0 <= ts_ns - since < (step - last - 1) * step_ns

    def _record_loss(self, cur: Incarnation, ts_ns, step, ce, ce_raw, parts_json) -> None:
        self.batch.incarnations[cur.number] = cur
        if ce != ce or ce in (math.inf, -math.inf):  # nan or inf: stored as NULL, ce_raw says which
            ce = None
        self.batch.loss_parts.append((self.run, cur.number, step, ts_ns, ce, ce_raw, parts_json))
        self.counters.loss_parts += 1
        if ts_ns is not None:
            self.ids.add(LOSS, cur.number, step, ts_ns)

    def _late_head(self, ts_ns: int | None) -> bool:
        """A start-up or restore line of the current incarnation's own container read after its
        steps (its head rotated away unread, then served again): stamped after the container
        started and before the first step read. A restart writes after its steps; this line,
        taken for one, opened a false incarnation (chaos seed 66)."""
        cur = self.current
        if ts_ns is None or cur is None or cur.last_step is None or self._stream != self._step_stream:
            return False
        loss = self.ids.kinds[LOSS].get(cur.number)
        first = None if loss is None else loss.first_ns()
        started = cur.container_started_ns
        return started is not None and first is not None and started <= ts_ns < first

    def _late(self, kind: int, cur: Incarnation, last: int, step: int, ts_ns: int | None) -> bool:
        """Whether a record going back to `step` (not recorded) is a late line of `cur`, not a
        replay: stamped before the kind's last step of `cur`, and between the stamps of the
        steps recorded either side of it. A restart writes after the line before it; an old block
        served again (lines once rotated away unread) does not, and was taken for a replay: a
        false incarnation (chaos seed 1007)."""
        stamps = self.ids.kinds[kind].get(cur.number)
        if ts_ns is None or stamps is None or stamps.stamp(step) is not None:
            return False
        last_ts = stamps.stamp(last)
        if last_ts is None or ts_ns >= last_ts:
            return False
        # the nearest recorded steps either side, within a hole's reach (a longer one: held)
        below = next((t for s in range(step - 1, step - 2 - MAX_HOLE, -1) if (t := stamps.stamp(s)) is not None), None)
        above = next((t for s in range(step + 1, min(last, step + 1 + MAX_HOLE) + 1)
                      if (t := stamps.stamp(s)) is not None), None)
        if above is None or ts_ns >= above:
            return False
        if below is None and (first := stamps.first_step()) is not None and step < first:
            # below the first step recorded (a head rotated away unread, served again): a line of
            # this container, stamped after it started, is late; a restart writes after (seed 66)
            started = cur.container_started_ns
            return started is not None and started <= ts_ns
        return below is not None and below < ts_ns

    def _rbf(self, ts_ns, step, mx, per_layer_json, program, line=None) -> None:
        ids = self.ids
        if ts_ns is not None and ids.top_ns is not None and ts_ns <= ids.top_ns and ids.known(RBF, step, ts_ns):
            self.counters.duplicates += 1
            return
        cur = self.current if self.current is not None else self._open(ts_ns)
        last, planned = cur.last_rbf, self.planned_steps
        if (last is None or step > last + STEP_JUMP_MIN or (planned is not None and step > planned)) and \
                self._absurd(step, cur, last):
            self._step_jump("required_rbf", (self.run, cur.number, step, ts_ns, mx, per_layer_json, program),
                            cur, cur.last_rbf, line)
            return
        if self._too_fast(RBF, cur, last, step, ts_ns):
            self._step_jump("required_rbf", (self.run, cur.number, step, ts_ns, mx, per_layer_json, program),
                            cur, last, line, TOO_FAST)
            return
        if cur.last_rbf is not None and step <= cur.last_rbf:
            if self._pending is not None and step >= self._pending.step:
                self._pending.held.append((self._rbf, (ts_ns, step, mx, per_layer_json, program, line)))
                return
            if not self._late(RBF, cur, cur.last_rbf, step, ts_ns) and not self._beside_loss(RBF, cur, step):
                self.counters.duplicates += 1
                return
        else:
            cur.last_rbf = step
        self.batch.required_rbf.append((self.run, cur.number, step, ts_ns, mx, per_layer_json, program))
        self.counters.required_rbf += 1
        if ts_ns is not None:
            ids.add(RBF, cur.number, step, ts_ns)

    def _pod(self, ts_ns, step, seconds, tflops, tokens, total_weights, loss, line=None, extra_json="{}") -> None:
        ids = self.ids
        if ts_ns is not None and ids.top_ns is not None and ts_ns <= ids.top_ns and ids.known(POD, step, ts_ns):
            self.counters.duplicates += 1
            return
        cur = self.current if self.current is not None else self._open(ts_ns)
        last, planned = cur.last_pod_step, self.planned_steps
        if (last is None or step > last + STEP_JUMP_MIN or (planned is not None and step > planned)) and \
                self._absurd(step, cur, last):
            row = (self.run, cur.number, step, ts_ns, seconds, tflops, tokens, total_weights, loss, extra_json)
            self._step_jump("pod_metrics", row, cur, cur.last_pod_step, line)
            return
        if self._too_fast(POD, cur, last, step, ts_ns):
            row = (self.run, cur.number, step, ts_ns, seconds, tflops, tokens, total_weights, loss, extra_json)
            self._step_jump("pod_metrics", row, cur, last, line, TOO_FAST)
            return
        if cur.last_pod_step is not None and step <= cur.last_pod_step:
            if self._pending is not None and step >= self._pending.step:
                self._pending.held.append(
                    (self._pod, (ts_ns, step, seconds, tflops, tokens, total_weights, loss, line, extra_json)))
                return
            if not self._late(POD, cur, cur.last_pod_step, step, ts_ns) and not self._beside_loss(POD, cur, step):
                self.counters.duplicates += 1
                return
        else:
            cur.last_pod_step = step
        self.batch.pod_metrics.append(
            (self.run, cur.number, step, ts_ns, seconds, tflops, tokens, total_weights, loss, extra_json)
        )
        self.counters.pod_steps += 1
        if ts_ns is not None:
            ids.add(POD, cur.number, step, ts_ns)

    def _too_fast(self, kind: int, cur: Incarnation, last: int | None, step: int, ts_ns: int | None) -> bool:
        """Whether `step`, ahead of the kind's `last`, came sooner than the steps between could
        run: LOSS-PARTS step 1000 stamped with step 5 is a lone line (it forked the run at 6),
        while steps lost to a rotation were run and took their time. Needs stamps and two
        steps of the incarnation to know its pace; without them, or stamped before the last,
        not judged."""
        if last is None or step <= last + 1 or ts_ns is None or cur.last_step is None:
            return False  # no step skipped (the common case), or nothing to measure by
        stamps = self.ids.kinds[kind].get(cur.number)
        pace = self.ids.kinds[LOSS].get(cur.number)
        since = None if stamps is None else stamps.stamp(last)
        step_ns = None if pace is None else pace.step_ns(cur.last_step)
        if since is None or not step_ns:
            return False
        elapsed = ts_ns - since
        # stamped before the last: a node clock stepped back (NTP), not a measure of anything
        return 0 <= elapsed and elapsed * SPEED_LIMIT < (step - last - 1) * step_ns

    def _beside_loss(self, kind: int, cur: Incarnation, step: int) -> bool:
        """A record of `kind` behind the kind's own last step, yet at the step LOSS-PARTS is on
        (or the next) with no record of its kind there: the kind's last step was a lone line
        ahead of the run (a `completed step: 1000` after step 1 cost steps 2-60 their rows,
        the fuzz test found). A replay's record meets a row of its kind already there."""
        at = cur.last_step
        if at is None or not at <= step <= at + 1:
            return False
        stamps = self.ids.kinds[kind].get(cur.number)
        return stamps is None or stamps.stamp(step) is None

    def _step_ref(self, cur: Incarnation | None, last: int | None) -> int | None:
        """The step a new one of a kind is measured against: the kind's last, else the
        incarnation's last LOSS-PARTS step, else the step it restored from, else the last
        LOSS-PARTS step of the incarnation before."""
        if last is not None:
            return last
        if cur is not None and cur.last_step is not None:
            return cur.last_step
        if cur is not None and cur.restored_from is not None:
            return cur.restored_from
        return self._prior_step

    def _absurd(self, step: int, cur: Incarnation | None, last: int | None) -> bool:
        planned = self.planned_steps
        if last is not None and step <= last + STEP_JUMP_MIN and (planned is None or step <= planned):
            return False  # the common case, in two comparisons
        ref = self._step_ref(cur, last)
        if ref is not None and step <= ref:
            return False  # going back: a restart, never a jump
        if planned is not None and step > planned and (ref is None or step > ref + 1):
            return True
        return ref is not None and step > ref * STEP_JUMP_FACTOR and step > ref + STEP_JUMP_MIN

    def _step_jump(self, table: str, row: tuple, cur: Incarnation | None, last: int | None, line,
                   why: str = "") -> None:
        """Flag and quarantine a row whose step jumped absurdly: not a step, not a restart."""
        step, ref = row[TABLES[table].STEP], self._step_ref(cur, last)
        after = (f"after step {ref}" if ref is not None else "as the first step") + why
        planned = f" (the run is configured for {self.planned_steps} steps)" if self.planned_steps else ""
        what = f"step {step} {after}{planned}"
        self._flag(STEP_JUMP, step, f"{what}: not recorded as a step nor taken for a restart; "
                   f"line: {_text(line) if line is not None else row}")
        self.batch.quarantine.append(quarantine_row(table, row, f"step_jump: {what}"))
        self.ids.quarantine(table, step, row[TABLES[table].TS_NS])

    def _other_container(self) -> bool:
        """The stream fed now is another container instance than the one of the incarnation's
        last step: the trainer started again, though its start-up lines were not read (rotated
        away) and its first step is past the last one. After a resume (no stream of the last
        step yet), another pod than the incarnation's own is that evidence: a pod holds one
        process 0 (a collector restart or a handover would else merge a restart into it)."""
        prev = self._step_stream
        if prev is None:
            cur = self.current
            return cur is not None and cur.pod is not None and self.pod is not None and \
                self.pod != cur.pod and POD_STREAM.fullmatch(self._stream) is not None
        return POD_STREAM.fullmatch(prev) is not None and POD_STREAM.fullmatch(self._stream) is not None

    # -- a step going back without evidence of a restart ---------------------------------
    def _hold(self, pending: _Pending) -> None:
        """Hold the step until the next LOSS-PARTS step decides (see _decide). The cursor saved
        meanwhile is the one from before the line: a collector restarted reads it again."""
        cursor = self.cursors[self._stream]
        snapshot = cursor.copy()
        if pending.line is not None:
            snapshot.forget(pending.line)
        pending.stream, pending.cursor = self._stream, snapshot
        self._pending = pending

    def _decide(self, step: int) -> None:
        """The step after a held one: if it goes on from the held step (and not from the old
        sequence), the trainer restarted and its start-up lines were rotated away: a new
        incarnation opens at the held step, rows in order. Else the held line was a lone
        out-of-sequence line: quarantined and flagged."""
        p, cur = self._pending, self.current
        if p.ahead:
            self._pending = None
            if cur.last_step < step < p.step:  # the run goes on below it: a lone line ahead
                self._lone(p, cur, "ahead of the run, the next step going on below it")
            else:
                self._evidence, self._step_stream = False, p.stream
                self._take_ahead(p, cur)
            return
        if cur is not None and cur.last_step is not None and p.step < step <= cur.last_step:
            self._pending = None
            self._open(p.ts_ns)
            self._loss(p.ts_ns, p.step, p.ce, p.ce_raw, p.parts_json, p.line)
            for fn, args in p.held:
                fn(*args)
        else:
            self.settle()

    def settle(self) -> None:
        """Decide a held step with no step after it (the log ended, a start-up or restore
        line came): a step going back is a lone out-of-sequence line, quarantined and flagged
        (a warning); a step ahead is recorded (nothing says it is not the run's)."""
        p, self._pending = self._pending, None
        if p is None:
            return
        cur = self.current
        if p.ahead:
            self._take_ahead(p, cur)
            return
        self._lone(p, cur, "with no restart evidence and no step going on from it")

    def _take_ahead(self, p: _Pending, cur: Incarnation) -> None:
        """A held step ahead decided the run's: recorded as the incarnation's last step."""
        cur.last_step = p.step
        self._record_loss(cur, p.ts_ns, p.step, p.ce, p.ce_raw, p.parts_json)

    def _lone(self, p: _Pending, cur: Incarnation | None, why: str) -> None:
        """A held step decided a lone out-of-sequence line: quarantined and flagged."""
        inc, last = (cur.number, cur.last_step) if cur is not None else (0, None)
        what = f"step {p.step} after step {last}, {why}"
        self._flag(STEP_JUMP, p.step, f"{what}: not recorded as a step nor taken for a restart; "
                   f"line: {_text(p.line) if p.line is not None else p.step}")
        row = (self.run, inc, p.step, p.ts_ns, p.ce, p.ce_raw, p.parts_json)
        self.batch.quarantine.append(quarantine_row("loss_parts", row, f"{'step_ahead' if p.ahead else 'step_back'}: {what}"))
        self.ids.quarantine("loss_parts", p.step, p.ts_ns)
        self.counters.duplicates += len(p.held)

    def ran_on(self, pod: str, **facts) -> None:
        """What `pod` runs on (image, image_id, topology, hosts, container_started_ns), learnt
        from the cluster: kept
        for the incarnation its lines open, and filled into the current one if it is that pod's
        and lacks them (the JobSet's object may be read after the first lines)."""
        known = self.pod_facts.setdefault(pod, {})
        known.update({k: v for k, v in facts.items() if v is not None})
        cur = self.current
        if cur is not None and cur.pod == pod:
            missing = {k: v for k, v in known.items() if getattr(cur, k) is None}
            if missing:
                for k, v in missing.items():
                    setattr(cur, k, v)
                self._touch(cur)

    def _ensure(self, ts_ns: int | None) -> Incarnation:
        return self.current if self.current is not None else self._open(ts_ns)

    def _open(self, ts_ns: int | None) -> Incarnation:
        if self.current is not None and self.current.last_step is not None:
            self._prior_step = self.current.last_step
        self.count += 1
        self.current = Incarnation(self.count, started_ns=ts_ns, pod=self.pod,
                                   **self.pod_facts.get(self.pod or "", {}))
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
        batch.cursors = {k: c.copy() for k, c in batch.cursors.items()}
        if self._pending is not None and self._pending.stream in batch.cursors:
            batch.cursors[self._pending.stream] = self._pending.cursor.copy()
        # the stream of the last step, saved with its cursor: a step going back on it after a
        # resume is held as it would be now (load_model)
        inc = self.current.number if self.current is not None else None
        for key, cursor in batch.cursors.items():
            cursor.steps = inc if key == self._step_stream else None
        return batch
