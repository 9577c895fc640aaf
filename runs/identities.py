"""A run's record identities: which record lines were recorded, however long ago, by kind,
step and kubelet stamp, per incarnation (runs.model asks them before recording a line; the
store's step rows fill them on a resume: storage.sql.load_model)."""

from __future__ import annotations

from array import array
from bisect import bisect_right
from itertools import pairwise, repeat

from steptail.parsers.records import ItemKind

LOSS, RBF, POD = 0, 1, 2
IDENTITY_TABLES = ("loss_parts", "required_rbf", "pod_metrics")
KIND_OF = {ItemKind.LOSS: LOSS, ItemKind.RBF: RBF, ItemKind.POD: POD}
HOLE = -(2**63)  # the stamp slot of a step not recorded, between two recorded ones
MAX_HOLE = 64  # steps missing within a segment; a longer jump starts a new one


class _Stamps:
    """One kind's records of one incarnation: each recorded step's stamp, in step order (a
    kind's steps only rise within an incarnation). Segments of consecutive steps, one 8-byte
    stamp a step: `firsts[i]` the first step of `segs[i]`."""

    __slots__ = ("firsts", "segs", "odd")

    def __init__(self) -> None:
        self.firsts: list[int] = []
        self.segs: list[array] = []
        self.odd: dict[int, int] | None = None  # a step recorded below the last one (never, by the model)

    def add(self, step: int, ts: int) -> None:
        firsts, segs = self.firsts, self.segs
        if segs:
            seg = segs[-1]
            nxt = firsts[-1] + len(seg)
            if nxt <= step <= nxt + MAX_HOLE:
                if step > nxt:
                    seg.extend(repeat(HOLE, step - nxt))
                seg.append(ts)
                return
            if step < nxt:
                if self.odd is None:
                    self.odd = {}
                self.odd[step] = ts
                return
        firsts.append(step)
        segs.append(array("q", (ts,)))

    def extend(self, steps, stamps) -> None:
        """Steps strictly rising (a steady block's column), their stamps."""
        segs = self.segs
        if segs and steps[0] == self.firsts[-1] + len(segs[-1]) and steps[-1] - steps[0] == len(steps) - 1:
            segs[-1].extend(stamps)  # consecutive, going on from the last: the common case
            return
        add = self.add
        for step, ts in zip(steps, stamps, strict=True):
            add(step, ts)

    def stamp(self, step: int) -> int | None:
        """The stamp of `step`, if recorded."""
        i = bisect_right(self.firsts, step) - 1
        if i >= 0:
            k = step - self.firsts[i]
            seg = self.segs[i]
            if k < len(seg) and seg[k] != HOLE:
                return seg[k]
        return None if self.odd is None else self.odd.get(step)

    def step_ns(self, step: int, back: int = 32) -> int | None:
        """The median time between consecutive steps recorded up to `step` (at most `back` of
        them): how fast this run steps, robust to a checkpoint save's long step."""
        times = [self.stamp(s) for s in range(step, step - back - 1, -1)]
        gaps = sorted(a - b for a, b in pairwise(times) if a is not None and b is not None)
        return gaps[len(gaps) // 2] if gaps else None

    def first_step(self) -> int | None:
        """The lowest step recorded."""
        return min([*self.firsts[:1], *(self.odd or ())], default=None)

    def first_ns(self) -> int | None:
        return self.segs[0][0] if self.segs else None

    def nbytes(self) -> int:
        return sum(s.buffer_info()[1] * s.itemsize for s in self.segs)


class Identities:
    """Which lines of a run were recorded, however long ago: a record line (LOSS-PARTS,
    REQUIRED_RBF, `completed step`) by its kind, step and kubelet stamp (what the store's step
    rows hold: storage.sql.load_model fills this from them), per incarnation; the trainer's
    start-up lines and checkpoint lines (the lines that open an incarnation or are its evidence)
    by their stamps. A line stamped after every stamp here (`top_ns`) is new, at no cost: that
    is nearly every line. One stamp per record, 8 bytes (benchmarks/identity.py).

    A start-up line read again is known by its stamp and text, or lies within a recorded
    incarnation's start-up: from the line that opened it (incarnations.started_ns) to its first
    record; so does a config line read again."""

    __slots__ = ("kinds", "top_ns", "starts", "marks", "quarantined")

    def __init__(self) -> None:
        self.kinds: tuple[dict[int, _Stamps], ...] = ({}, {}, {})  # per kind: incarnation -> stamps
        self.top_ns: int | None = None  # the latest stamp here
        self.starts: dict[int, int] = {}  # incarnation -> started_ns, of those that read their start-up
        self.marks: set[tuple] = set()  # ("start", digest, ts) and (checkpoint kind, step, ts) of lines read
        self.quarantined: set[tuple] = set()  # (kind, step, ts) of record lines kept out (flagged once)

    def _top(self, ts: int) -> None:
        if self.top_ns is None or ts > self.top_ns:
            self.top_ns = ts

    def add(self, kind: int, inc: int, step: int, ts: int | None) -> None:
        if ts is None:
            return  # no stamp, no identity (an unstamped file is deduplicated whole)
        stamps = self.kinds[kind].get(inc)
        if stamps is None:
            stamps = self.kinds[kind][inc] = _Stamps()
        stamps.add(step, ts)
        if self.top_ns is None or ts > self.top_ns:
            self.top_ns = ts

    def extend(self, kind: int, inc: int, steps, stamps) -> None:
        """A steady block's column of one kind (steps rising, stamps non-decreasing, all set)."""
        if not steps or stamps[0] is None:
            return
        rows = self.kinds[kind].get(inc)
        if rows is None:
            rows = self.kinds[kind][inc] = _Stamps()
        rows.extend(steps, stamps)
        self._top(stamps[-1])

    def known(self, kind: int, step: int, ts: int | None) -> bool:
        """Whether this record (kind, step, stamp) was recorded, in any incarnation, or kept
        out (quarantined: flagged once)."""
        top = self.top_ns
        if ts is None or top is None or ts > top:
            return False
        if self.quarantined and (kind, step, ts) in self.quarantined:
            return True
        for stamps in self.kinds[kind].values():
            if stamps.stamp(step) == ts:
                return True
        return False

    def any_known(self, kind: int, steps, stamps) -> bool:
        """Whether any row of a steady block's column (stamps non-decreasing) was recorded."""
        top = self.top_ns
        if top is None or not steps or stamps[0] is None or stamps[0] > top:
            return False
        known = self.known
        for step, ts in zip(steps, stamps, strict=True):
            if ts > top:
                return False
            if known(kind, step, ts):
                return True
        return False

    def bad(self, digest: str, ts: int) -> bool:
        """A bad line by its identity (bad_line_digest, its stamp): True when it was counted
        before, however long ago (a saved log ingested again: its cursor remembers ~4 s),
        else remembered now."""
        key = ("bad", digest, ts)
        if key in self.marks:
            return True
        self.mark(key)
        return False

    def quarantine(self, table: str, step, ts) -> None:
        """A record line kept out of its table (quarantine): read again, it is a repeat."""
        if table in IDENTITY_TABLES and isinstance(step, int) and isinstance(ts, int):
            self.quarantined.add((IDENTITY_TABLES.index(table), step, ts))
            self._top(ts)

    def mark(self, key: tuple) -> None:
        """A start-up line ("start", digest, ts) or a checkpoint line (kind, step, ts) read."""
        self.marks.add(key)
        self._top(key[-1])

    def marked(self, key: tuple) -> bool:
        top = self.top_ns
        return top is not None and key[-1] <= top and key in self.marks

    def start_repeat(self, ts: int, digest: str | None = None) -> bool:
        """Whether a start-up line stamped `ts` (`digest`: line_digest of the line) was read
        before: it is a line read (its stamp and text), or it lies within a recorded
        incarnation's start-up (from its opening line to its first record: what the store tells)."""
        top = self.top_ns
        if top is None or ts > top:
            return False
        if digest is not None and ("start", digest, ts) in self.marks:
            return True
        for inc, started in self.starts.items():
            if started <= ts:
                first = self.first_record_ns(inc)
                if first is not None and ts <= first:
                    return True
        return False

    def first_record_ns(self, inc: int) -> int | None:
        firsts = [ts for kind in self.kinds if (s := kind.get(inc)) is not None and (ts := s.first_ns()) is not None]
        return min(firsts) if firsts else None

    def nbytes(self) -> int:
        """Bytes of the stamps held (the arrays' buffers)."""
        return sum(s.nbytes() for kind in self.kinds for s in kind.values())
