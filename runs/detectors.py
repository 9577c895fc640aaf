"""The detectors: one incremental engine over a run's rows, shared by `check` (fed the stored
rows) and `follow` (fed each batch as it is taken from the run model).

Results never depend on how rows are cut into batches: rows are handled per incarnation in
ascending order, and within an incarnation config, checkpoints, LOSS-PARTS, then
REQUIRED_RBF (each table in log order). A decision that needs a later row (is this step's
REQUIRED_RBF missing? does this mismatch range go on?) waits for it.

Findings that cover a range of steps found one step at a time (resume_mismatch,
nonfinite_ce, missing_rbf) are returned when opened and returned again, same key, each time
they grow: alert on the first, store the last (save_findings upserts)."""

from __future__ import annotations

import heapq
import math
import time
from array import array
from bisect import bisect_right
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from itertools import islice
from operator import itemgetter

from steptail.parsers import format_ns
from steptail.runs.detect import DETECTORS, Detector
from steptail.runs.detect.base import CP_PARAM, IncView, as_int, fmt_ce
from steptail.runs.findings import (
    CRITICAL,
    MISSING_RBF,
    NO_INCARNATION,
    NO_STEP,
    NONFINITE_CE,
    RESUME_MISMATCH,
    STALL,
    UNREAD_TAIL,
    UNREADABLE_LOG,
    WARNING,
    Finding,
    Settings,
    step_range,
)
from steptail.runs.gaps import (
    PERIOD_PARAM,
    StepGap,
    at_head,
    between,
    checkpoint_period,
    resumed_after,
)
from steptail.runs.model import Batch
from steptail.runs.rows import (
    CHECKPOINTS,
    CONFIG,
    FLAGS,
    INCARNATION,
    INCARNATIONS,
    LOSS_PARTS,
    REQUIRED_RBF,
)
from steptail.runs.stream_gap import StreamGap

_INCARNATION = itemgetter(INCARNATION)
_LOSS_STEP, _LOSS_TS, _LOSS_CE = itemgetter(LOSS_PARTS.STEP), itemgetter(LOSS_PARTS.TS_NS), itemgetter(LOSS_PARTS.CE)
_RBF_STEP = itemgetter(REQUIRED_RBF.STEP)
# Rows of one incarnation in a batch from which the steady path is tried (below it, the
# per-row path costs less than the checks).
STEADY_MIN = 32
# Follower failures that are the run's findings, and what each means for the run: only data
# lost. The collector's own faults that lost nothing (auth, stream, Parquet failures) are
# collector events, health (steptail.collector.notify.collector_events), never findings; one
# that lost steps is named as the cause on the gap finding (the stream gap's reason).
FAILURES = {
    UNREAD_TAIL: "could not read the end of a pod's log",
    UNREADABLE_LOG: "read a log mostly unreadable",
}


class RunningMedian:
    """Median of a growing sample in O(log n) per value (two heaps)."""

    def __init__(self) -> None:
        self._low: list[float] = []  # max-heap (negated)
        self._high: list[float] = []
        self.count = 0

    def add(self, x: float) -> None:
        if self._low and x > -self._low[0]:
            heapq.heappush(self._high, x)
        else:
            heapq.heappush(self._low, -x)
        if len(self._low) > len(self._high) + 1:
            heapq.heappush(self._high, -heapq.heappop(self._low))
        elif len(self._high) > len(self._low):
            heapq.heappush(self._low, -heapq.heappop(self._high))
        self.count += 1

    def extend(self, xs: list[float]) -> None:
        """add() for each of `xs`, in bulk: the median depends only on the values (the
        lower half holds the smallest ceil(n/2)), so the order they go in does not matter."""
        low, high, push, pop = self._low, self._high, heapq.heappush, heapq.heappop
        if low:  # everything <= the lower half's top goes low, the rest high: halves stay ordered
            top = -low[0]
            for x in xs:
                if x > top:
                    push(high, x)
                else:
                    push(low, -x)
        else:
            for x in xs:
                push(low, -x)
        while len(low) > len(high) + 1:
            push(high, -pop(low))
        while len(high) > len(low):
            push(low, -pop(high))
        self.count += len(xs)

    def floor_while_adding(self, m: int) -> float | None:
        """A value no median reaches below while up to `m` more values are added (None if
        none is known): at least ceil(n/2) - j of the lower median's ranks are old values
        after j additions, so the median stays >= the old sample's r-th smallest,
        r = ceil((n + m - 1) / 2) - (m - 1); that one is the q-th largest of the lower half,
        and any q of its values have a minimum no larger."""
        n = self.count
        r = (n + m) // 2 - (m - 1)  # (n + m) // 2 == ceil((n + m - 1) / 2)
        if r < 1:
            return None
        q = len(self._low) - r + 1
        return -max(self._low[:q])

    def value(self) -> float | None:
        if not self.count:
            return None
        if len(self._low) > len(self._high):
            return -self._low[0]
        return (-self._low[0] + self._high[0]) / 2


class FirstRecordings:
    """step -> (incarnation, ce, ce_raw) of a step's first recording, in 12 bytes a step for
    dense step numbers (a follower holds one per run, for the run's whole life)."""

    DENSE_LIMIT = 10_000_000  # steps beyond this (bogus or sparse) go to a dict

    def __init__(self) -> None:
        self._inc = array("i")  # 0: not recorded
        self._ce = array("d")  # nan when not finite; the token is in _raw
        self._raw: dict[int, str] = {}
        self._sparse: dict[int, tuple[int, float | None, str]] = {}

    def get(self, step: int) -> tuple[int, float | None, str] | None:
        if 0 <= step < len(self._inc):
            inc = self._inc[step]
            if not inc:
                return None
            ce = self._ce[step]
            return (inc, None, self._raw[step]) if step in self._raw else (inc, ce, "")
        return self._sparse.get(step)

    def add_run(self, first: int, inc: int, ces: list[float]) -> bool:
        """add() of steps first, first + 1, ... with these finite ce values, when all fit the
        dense part; False (nothing added) otherwise."""
        end = first + len(ces)
        if first < 0 or end > self.DENSE_LIMIT:
            return False
        if end > len(self._inc):
            grow = min(max(end, 2 * len(self._inc), 1024), self.DENSE_LIMIT) - len(self._inc)
            self._inc.extend(array("i", [0]) * grow)
            self._ce.extend(array("d", [0.0]) * grow)
        self._inc[first:end] = array("i", [inc]) * len(ces)
        self._ce[first:end] = array("d", ces)
        return True

    def add(self, step: int, inc: int, ce: float | None, raw: str) -> None:
        if not 0 <= step < self.DENSE_LIMIT:
            self._sparse[step] = (inc, ce, raw)
            return
        if step >= len(self._inc):
            # doubled, not grown by one: steps arrive one by one and each extend copies
            grow = min(max(step + 1, 2 * len(self._inc), 1024), self.DENSE_LIMIT) - len(self._inc)
            self._inc.extend(array("i", [0]) * grow)
            self._ce.extend(array("d", [0.0]) * grow)
        self._inc[step] = inc
        self._ce[step] = math.nan if ce is None else ce
        if ce is None:
            self._raw[step] = raw


class FindingEngine:
    """The loop over a run's rows: the detectors of every step here, the others plug-ins
    (runs/detect), asked in turn (the Engine they are given is this object)."""

    def __init__(
        self,
        run: str,
        settings: Settings | None = None,
        reference_ce: dict[int, float] | None = None,
        clock: Callable[[], int] = time.time_ns,
        detectors: Iterable[type[Detector]] = DETECTORS,
    ) -> None:
        self.run = run
        self.settings = settings or Settings()
        self.reference_ce = dict(reference_ce or {})
        self.clock = clock
        self.findings: dict[tuple, Finding] = {}  # every finding so far, by key, latest state
        self._incs: dict[int, IncView] = {}
        self._current = 0
        self._first = FirstRecordings()
        self._max_step: int | None = None
        self._probe = False  # the run logs REQUIRED_RBF
        self._cp: int | None = None  # latest ici_context_parallelism seen
        self._median = RunningMedian()
        # the longest interval of a step right after a checkpoint save: the saves' own expected
        # duration, learned from the run (a maximum: it only grows, so a batch can be judged at once)
        self._save_max: float | None = None
        self._arrival_ns: int | None = None  # clock when the latest step was observed
        self._watching = True  # the stream is being read (the stall clock runs); see tick
        self._gaps: list[StreamGap] = []
        self._ranges: dict[tuple[str, int], Finding] = {}
        self._out: dict[tuple, Finding] = {}
        self._detectors = [cls(self) for cls in detectors]

    # -- what a plug-in detector is given (runs.detect.base.Engine) --------------------------
    def emit(self, kind: str, inc: int, first: int, last: int, detail: str, severity: str,
             now_ns: int | None = None) -> Finding | None:
        return self._emit(kind, inc, first, last, detail, severity, now_ns)

    def changed(self, f: Finding) -> None:
        self._out[f.key] = f

    def incarnations(self) -> dict[int, IncView]:
        return self._incs

    @property
    def max_step(self) -> int | None:
        return self._max_step

    @property
    def cp(self) -> int | None:
        return self._cp

    # -- inputs ------------------------------------------------------------------------
    def observe(self, batch: Batch) -> list[Finding]:
        """Rows in log order; returns the findings opened or grown by them."""
        by_inc: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        for table in ("config", "checkpoints", "pod_metrics", "loss_parts", "required_rbf"):
            rows = getattr(batch, table)
            numbers = set(map(_INCARNATION, rows))
            if len(numbers) == 1:  # the usual batch: one incarnation, no need to split its rows
                by_inc[numbers.pop()][table] = rows
                continue
            for row in rows:
                by_inc[row[INCARNATION]][table].append(row)
        for n in batch.incarnations:
            by_inc[n]  # noqa: B018 - an incarnation row alone still opens it
        for n in sorted(by_inc):
            inc = self._enter(n, batch.incarnations.get(n))
            rows = by_inc[n]
            for row in rows["config"]:
                self._config(inc, row[CONFIG.NAME], row[CONFIG.VALUE])
            for row in rows["checkpoints"]:
                self._checkpoint(inc, row[CHECKPOINTS.KIND], row[CHECKPOINTS.STEP])
            for d in self._detectors:
                d.rows(inc, rows)
            self._losses(inc, rows["loss_parts"])
            self._rbfs(inc, rows["required_rbf"])
        for row in batch.flags:  # lines the model flagged
            self._emit(row[FLAGS.KIND], row[FLAGS.INCARNATION], row[FLAGS.FIRST_STEP], row[FLAGS.LAST_STEP],
                       row[FLAGS.DETAIL], row[FLAGS.SEVERITY], row[FLAGS.DETECTED_NS])
        return self._flush()

    def observe_stream_gap(self, gap: StreamGap) -> list[Finding]:
        """A window whose lines were lost (from the follower, or the stream_gaps table): gap
        findings over that window name it."""
        self._gaps.append(gap)
        return []

    def observe_failure(self, kind: str, reason: str, now_ns: int,
                        at: tuple[int, int | None] | None = None) -> list[Finding]:
        """An unread_tail from the follower (the collector's other faults are not the run's
        findings: collector events). One finding per position in the run (incarnation, last
        step): repeated failures at the same place alert once. `at`: the position when the
        follower knows it better than the latest rows do (an unread tail: the incarnation and
        last step of the stream that lost it; the steps after that step are lost, their number
        unknown)."""
        what = FAILURES.get(kind)
        if what is None:
            raise ValueError(f"not a failure kind: {kind!r}")
        if at is not None:
            number, last = at
        else:
            inc = self._incs.get(self._current)
            number, last = self._current, inc.last_step if inc else None
        step = last if last is not None else NO_STEP
        where = f"after step {step}" if step != NO_STEP else "before any step"
        self._emit(
            kind, number or NO_INCARNATION, step, step,
            f"the follower {what} ({where}): {reason}", WARNING, now_ns,
        )
        return self._flush()

    def observe_cluster(self, findings: list[Finding]) -> list[Finding]:
        """Findings read off the cluster's objects, not the log (a runbook rule the live JobSet
        breaks, a failed JobSet deleted with its logs unsaved): each raised once per key. The
        load-balance rule seen in the JobSet's args joins the one seen in the config lines: one
        finding citing both (`_evidence`)."""
        for f in findings:
            if any(d.cluster(f) for d in self._detectors):
                continue
            self._emit(f.kind, f.incarnation, f.first_step, f.last_step, f.detail, f.severity, f.detected_ns)
        return self._flush()

    def remember(self, stored: list[Finding]) -> None:
        """The stored load-balance findings, before the rows are replayed (`check`, `ingest`,
        a resumed `follow`): the evidence the log cannot give again (the JobSet's args, seen
        live) stays cited, and a check that only reads the config lines changes nothing."""
        for d in self._detectors:
            d.remember(stored)

    def tick(self, now_ns: int, running: bool = True, heard_ns: int | None = None,
             heard_stamp_ns: int | None = None) -> list[Finding]:
        """Live stall check from the clock: no new step for k x the median step time.

        Live, the follower says until when it knows the stream held back nothing: `heard_ns`,
        a look at the pod that found nothing unread (wall time), and `heard_stamp_ns`, the
        stamp of its latest line, which vouches for the stamps' distance past the last step
        (arrived late in a re-read's backlog, it is no quiet of the trainer's). Quiet after
        both is not yet the trainer's (a hung stream, a collector that was not running): the
        wait is counted up to them only, and what a re-read then delivers is judged by its
        stamps (_stall)."""
        inc = self._incs.get(self._current)
        median = self._median_ready()
        if not running:
            self._watching = False
            return []
        if not self._watching:  # read again (a start, a take-over, a re-open): the wait starts now,
            self._watching = True  # not from a step stored before the stream was read
            if self._arrival_ns is not None:
                self._arrival_ns = max(self._arrival_ns, now_ns)
        if inc is None or inc.last_step is None or median is None or self._arrival_ns is None:
            return []
        planned = as_int(inc.config.get("steps"))
        if planned is not None and inc.last_step >= planned:
            return []  # training finished
        until = now_ns if heard_ns is None and heard_stamp_ns is None else \
            min(now_ns, self._heard_until(inc, heard_ns, heard_stamp_ns))
        waited = (until - self._arrival_ns) / 1e9
        expected = median
        if self._save_max is not None and self._after_save(inc, inc.last_step + 1):
            expected = max(median, self._save_max)  # saving a checkpoint: as long as the longest save so far
        if waited > max(self.settings.stall_k * expected, self.settings.stall_min_seconds):
            nxt = inc.last_step + 1
            self._emit(
                STALL, inc.number, nxt, nxt,
                f"no new step for {waited:.0f} s after step {inc.last_step} (median step time "
                f"{median:.1f} s, k={self.settings.stall_k:g})",
                WARNING, now_ns,
            )
        return self._flush()

    def _heard_until(self, inc, heard_ns: int | None, heard_stamp_ns: int | None) -> int:
        """Wall time up to which quiet is the trainer's (tick): a look's time, or the last
        step's arrival plus how far the latest line's stamp lies past that step's."""
        by_line = None
        if heard_stamp_ns is not None and inc.last_ts is not None:
            by_line = self._arrival_ns + heard_stamp_ns - inc.last_ts
        return max((t for t in (heard_ns, by_line) if t is not None), default=self._arrival_ns)

    def finish(self) -> list[Finding]:
        """End-of-data checks: REQUIRED_RBF still owed, then each plug-in's."""
        if self._probe:
            for inc in self._incs.values():
                final = inc.number == self._current
                pending = list(inc.pending_rbf)
                if final and pending and pending[-1] == inc.last_step:
                    pending.pop()  # its REQUIRED_RBF may still be on its way
                for s in pending:
                    self._missing_rbf(inc, s)
                inc.pending_rbf = deque(s for s in inc.pending_rbf if s not in pending)
        for d in self._detectors:
            d.finish()
        return self._flush()

    # -- the detectors -------------------------------------------------------------------
    def _enter(self, n: int, row: tuple | None) -> IncView:
        inc = self._incs.get(n)
        if inc is None:
            inc = self._incs[n] = IncView(n)
        if row is not None:
            inc.saw_start = inc.saw_start or bool(row[INCARNATIONS.SAW_START])
            if row[INCARNATIONS.RESTORED_FROM] is not None:
                inc.restored_from = row[INCARNATIONS.RESTORED_FROM]
        if n > self._current:
            for old in self._incs.values():
                if old.number < n and not old.closed:
                    self._close(old)
            self._current = n
        return inc

    def _close(self, inc: IncView) -> None:
        inc.closed = True
        if self._probe:
            while inc.pending_rbf:
                self._missing_rbf(inc, inc.pending_rbf.popleft())

    def _config(self, inc: IncView, name: str, value: str) -> None:
        inc.config[name] = value
        if name == CP_PARAM and as_int(value) is not None:
            self._cp = as_int(value)
        for d in self._detectors:
            d.config(inc, name, value)

    def _period(self, inc: IncView) -> int | None:
        """The run's checkpoint period as its config printed it, latest incarnation first."""
        for i in sorted(self._incs.values(), key=lambda i: -i.number):
            if i.number <= inc.number and (period := checkpoint_period(i.config.get(PERIOD_PARAM))):
                return period
        return None

    def _checkpoint(self, inc: IncView, kind: str, step: int) -> None:
        if kind == "restore":
            inc.restored_from = step
        elif kind == "save":
            inc.saved = step if inc.saved is None else max(inc.saved, step)
            inc.saves.add(step)

    def _loss(self, inc: IncView, step: int, ts: int | None, ce: float | None, ce_raw: str) -> None:
        if inc.last_step is None:
            self._first_step(inc, step, ts)
        elif step > inc.last_step:
            if step > inc.last_step + 1:  # between()'s cheap pre-test: this runs for every step
                self._gap(inc, step, ts)
            self._stall(inc, step, ts)
        else:
            return  # not a new step of this incarnation (the model never sends one)
        if ce is None:
            self._grow(NONFINITE_CE, inc.number, step, CRITICAL, self._nonfinite_detail, raw=ce_raw)
        first = self._first.get(step)
        if first is None:
            self._first.add(step, inc.number, ce, ce_raw)
        elif first[0] != inc.number:
            self._replay(inc, step, ce, ce_raw, first)
        if step == 1:
            for d in self._detectors:
                d.step_one(inc, ce, ce_raw)
        if step in inc.rbf_steps:
            pass
        elif inc.last_rbf is not None and step < inc.last_rbf:
            if self._probe:  # REQUIRED_RBF printed before LOSS-PARTS and this one never came
                self._missing_rbf(inc, step)
        else:
            inc.pending_rbf.append(step)
        inc.last_step, inc.last_ts = step, ts
        if self._max_step is None or step > self._max_step:
            self._max_step = step
        self._arrival_ns = self.clock()

    def _losses(self, inc: IncView, rows: list[tuple]) -> None:
        """_loss() of each row; a steady run of them at once (_steady_losses), tried again
        after the rows that cannot be (a replay, the run's first steps) went one by one."""
        # Column positions, looked up once: the loss loop runs for every step.
        step_at, ts_at, ce_at, raw_at = LOSS_PARTS.STEP, LOSS_PARTS.TS_NS, LOSS_PARTS.CE, LOSS_PARTS.CE_RAW
        i, n = 0, len(rows)
        for _ in range(3):
            if n - i < STEADY_MIN:
                break
            if self._steady_losses(inc, rows[i:] if i else rows):
                return
            # One by one: the steps recorded before (a replay), and at the run's start enough of
            # them for the step intervals known to bound the median over the rest.
            top, stop = self._max_step, i + max(1, (n - i - self._median.count + 3) // 2)
            while i < n and (i < stop or (top is not None and rows[i][step_at] <= top)):
                row = rows[i]
                self._loss(inc, row[step_at], row[ts_at], row[ce_at], row[raw_at])
                i += 1
        for row in islice(rows, i, None):
            self._loss(inc, row[step_at], row[ts_at], row[ce_at], row[raw_at])

    def _rbfs(self, inc: IncView, rows: list[tuple]) -> None:
        """_rbf() of each row; a steady run of them at once (_steady_rbfs), tried again after
        the first row (which may make the probe known) went alone."""
        step_at, i = REQUIRED_RBF.STEP, 0
        if len(rows) >= STEADY_MIN:
            if self._steady_rbfs(inc, rows):
                return
            self._rbf(inc, rows[0][step_at])
            i = 1
            if self._steady_rbfs(inc, rows[1:]):
                return
        for row in islice(rows, i, None):
            self._rbf(inc, row[step_at])

    def _steady_losses(self, inc: IncView, rows: list[tuple]) -> int:
        """_loss() of a steady run of rows at once: how many rows (a prefix) were taken, 0 if
        none. Steady: every step the next one, first recorded here (no replay), not step 1,
        a finite ce, a timestamp no earlier than the last, no REQUIRED_RBF seen for it, and no
        interval long enough to be a stall even at the lowest median the run can have by
        then. Anything else is left to _loss, row by row: no finding comes from here."""
        last, last_ts = inc.last_step, inc.last_ts
        if last is None or last_ts is None or self._max_step is None:
            return 0
        steps = list(map(_LOSS_STEP, rows))
        first, m = steps[0], len(steps)
        if first != last + 1 or first <= 1 or first <= self._max_step \
                or (inc.last_rbf is not None and inc.last_rbf >= first) \
                or steps != list(range(first, first + m)):
            return 0
        ces = list(map(_LOSS_CE, rows))
        if None in ces:
            return 0
        stamps = list(map(_LOSS_TS, rows))
        if None in stamps:
            return 0
        # (t - previous) / 1e9 / 1: what _stall computes for consecutive steps
        per = [(b - a) / 1e9 for a, b in zip([last_ts, *stamps[:-1]], stamps, strict=True)]
        if min(per) < 0:
            return 0
        saves = inc.saves
        saved = [i for i, s in enumerate(steps) if s - 1 in saves] if saves else []
        longest = self._save_max
        if saved:  # the steps after a save: judged as _save_stall does; here only if none is a stall
            for i in saved:
                if longest is not None and per[i] > max(self.settings.stall_k * longest, self.settings.stall_min_seconds):
                    return 0
                longest = per[i] if longest is None else max(longest, per[i])
            skip = set(saved)
            per = [p for i, p in enumerate(per) if i not in skip]
            m -= len(saved)
        median, settings = self._median, self.settings
        checked = per[max(0, settings.stall_min_intervals - median.count):]
        if checked:
            floor = median.floor_while_adding(m)
            if floor is None or settings.stall_k < 0 \
                    or max(checked) > max(settings.stall_k * floor, settings.stall_min_seconds):
                return 0
        if not self._first.add_run(first, inc.number, ces):
            return 0
        if saved:
            self._save_max = longest
            m += len(saved)
        median.extend(per)
        inc.pending_rbf.extend(steps)
        inc.last_step, inc.last_ts = steps[-1], stamps[-1]
        self._max_step = steps[-1]
        clock = self.clock
        if clock is time.time_ns:
            self._arrival_ns = clock()
        else:  # as often as _loss reads it (a test's clock may count)
            for _ in steps:
                self._arrival_ns = clock()
        return m

    def _steady_rbfs(self, inc: IncView, rows: list[tuple]) -> int:
        """_rbf() of a steady run of rows at once (how many were taken, 0 if none): the probe
        known, every step the next one, each the oldest LOSS-PARTS step awaiting it (so none
        goes missing)."""
        if not self._probe:
            return 0
        steps = list(map(_RBF_STEP, rows))
        first, m = steps[0], len(steps)
        pending = inc.pending_rbf
        if (inc.last_rbf is not None and inc.last_rbf >= first) or len(pending) < m \
                or pending[0] != first or steps != list(range(first, first + m)) \
                or list(islice(pending, m)) != steps:
            return 0
        for _ in steps:
            pending.popleft()
        # The set as _rbf leaves it (its content is state): _rbf keeps the steps above
        # step - 1024 whenever an add makes it hold 2049. Every step added here is above
        # those already in it, so only the last such cut decides what stays.
        old = sorted(inc.rbf_steps)
        size, cut, added = len(old), None, 0
        while added + 2049 - size <= m:
            added += 2049 - size
            cut = steps[added - 1] - 1024
            size = len(old) - bisect_right(old, cut) + steps[added - 1] - max(cut + 1, first) + 1
        if cut is None:
            inc.rbf_steps.update(steps)
        else:
            inc.rbf_steps = set(old[bisect_right(old, cut):]) | set(range(max(cut + 1, first), first + m))
        inc.last_rbf = steps[-1]
        return m

    def _first_step(self, inc: IncView, step: int, ts: int | None) -> None:
        for d in self._detectors:
            d.first_step(inc, step)
        earlier = [i for i in self._incs.values() if i.number < inc.number and i.last_step is not None]
        # this incarnation has no step yet: the highest one so far is its predecessors'
        printed = [i.saved for i in earlier if i.saved is not None]
        period = self._period(inc)
        saved = resumed_after(printed, any(not i.saw_start and i.restored_from is None for i in earlier),
                              self._max_step, period)
        gap = at_head(inc.number, inc.saw_start, inc.restored_from, step, self._max_step, saved)
        if gap is None:
            return
        if not gap.unread:
            after = f"the restore from step {inc.restored_from}" if inc.restored_from is not None else "start-up"
            self._emit(
                gap.kind, inc.number, gap.first_step, gap.last_step,
                f"{step_range(gap.first_step, gap.last_step)} missing at the head of incarnation {inc.number}: "
                f"its start-up was read, yet the first step recorded after {after} is {step} "
                f"({gap.count} steps)",
                WARNING,
            )
            return
        before = (f"; the run's earlier incarnations reached step {self._max_step}"
                  if self._max_step is not None else "")
        if printed:
            before += f" and saved a checkpoint at step {saved} (a restart resumes from it)"
        elif saved is not None and period and any(i.saw_start or i.restored_from is not None for i in earlier):
            before += (f"; with {PERIOD_PARAM} {period} their last checkpoint is at step {saved}"
                       + (" (none: a restart starts from step 1)" if saved == 0 else ""))
        elif saved == 0:
            before += ", their own head unread (a checkpoint saved in it cannot be excluded)"
        detail = (
            f"{step_range(gap.first_step, gap.last_step)} missing at the head of incarnation {inc.number} "
            f"({gap.count} steps): its log was read from step {step}, without the trainer's start-up or "
            f"a restore line{before} (following began late, the head of the log had rotated away, or a "
            "saved log starts mid-way). They were lost, or run before a restart from a checkpoint whose "
            "restore line was lost too: the log read cannot tell which"
        )
        # the stream gap the head went in (the follower's: from the container's start to this step)
        lost = [g for g in self._gaps if ts is not None and g.start_ns < ts and (g.end_ns is None or g.end_ns >= ts)]
        if lost:
            g = lost[0]
            until = format_ns(g.end_ns) if g.end_ns is not None else "now"
            detail += f"; the log stream {g.stream} could not be read ({g.reason}) from {format_ns(g.start_ns)} to {until}"
        self._emit(gap.kind, inc.number, gap.first_step, gap.last_step, detail, WARNING)
        self._unchecked(inc, gap, step)

    def _unchecked(self, inc: IncView, gap: StepGap, step: int) -> None:
        """The rules whose input is in the head that was not read (the config lines, step 1)
        say they could not run (a warning) or are not evaluable (info), never silence."""
        head = (f"incarnation {inc.number}'s log was read from step {step}: its start-up, config lines and "
                f"{step_range(gap.first_step, gap.last_step)} were not")
        for d in self._detectors:
            d.unread_head(inc, gap, step, head)

    def _gap(self, inc: IncView, step: int, ts: int | None) -> None:
        gap = between(inc.number, inc.last_step, step)
        if gap is None:
            return
        lo, hi = gap.first_step, gap.last_step
        detail = (
            f"{step_range(lo, hi)} missing between step {inc.last_step} and step {step} "
            f"of incarnation {inc.number} ({gap.count} steps)"
        )
        lost = [g for g in self._gaps if g.overlaps(inc.last_ts, ts)]
        if lost:
            g = lost[0]
            until = format_ns(g.end_ns) if g.end_ns is not None else "now"
            detail += (
                f"; lost while the log stream {g.stream} was interrupted ({g.reason}) "
                f"from {format_ns(g.start_ns)} to {until}"
            )
        self._emit(gap.kind, inc.number, lo, hi, detail, WARNING)

    def _after_save(self, inc: IncView, step: int) -> bool:
        """Whether `step` is the one after a checkpoint save of its incarnation (its interval
        holds the save)."""
        return step - 1 in inc.saves

    def _save_stall(self, inc: IncView, step: int, ts: int) -> None:
        """The step after a save, judged against the longest such step so far (none yet: not
        evaluable, only learned), never below the steps' own threshold."""
        waited = (ts - inc.last_ts) / 1e9
        longest, median = self._save_max, self._median_ready()
        k = self.settings.stall_k
        if longest is not None:
            limit = max(k * longest, k * median if median is not None else 0.0, self.settings.stall_min_seconds)
            if waited > limit:
                nxt = inc.last_step + 1
                self._emit(
                    STALL, inc.number, nxt, nxt,
                    f"step {step} came {waited:.0f} s after step {inc.last_step}, which saved a checkpoint "
                    f"(longest step after a save so far {longest:.1f} s, k={k:g})",
                    WARNING,
                )
        self._save_max = waited if longest is None else max(longest, waited)

    def _stall(self, inc: IncView, step: int, ts: int | None) -> None:
        if ts is None or inc.last_ts is None or ts < inc.last_ts:
            return
        if step == inc.last_step + 1 and self._after_save(inc, step):
            self._save_stall(inc, step, ts)
            return
        per_step = (ts - inc.last_ts) / 1e9 / (step - inc.last_step)  # lost steps explain time
        known = self._median  # _median_ready() inline: this runs for every step
        median = known.value() if known.count >= self.settings.stall_min_intervals else None
        if median is not None and per_step > max(self.settings.stall_k * median, self.settings.stall_min_seconds):
            nxt = inc.last_step + 1
            self._emit(
                STALL, inc.number, nxt, nxt,
                f"step {step} came {(ts - inc.last_ts) / 1e9:.0f} s after step {inc.last_step} "
                f"({per_step:.1f} s per step; median step time {median:.1f} s, "
                f"k={self.settings.stall_k:g})",
                WARNING,
            )
        self._median.add(per_step)

    def _median_ready(self) -> float | None:
        if self._median.count < self.settings.stall_min_intervals:
            return None
        return self._median.value()

    def _replay(self, inc: IncView, step: int, ce: float | None, raw: str, first: tuple) -> None:
        first_inc, first_ce, first_raw = first
        if ce is None and first_ce is None:
            return
        if ce is not None and first_ce is not None:
            delta = ce - first_ce
            if abs(delta) <= self.settings.resume_tolerance:
                return
        else:
            delta = float("nan")
        self._grow(
            RESUME_MISMATCH, inc.number, step, CRITICAL, self._mismatch_detail,
            delta=delta, ce=fmt_ce(ce, raw), first=fmt_ce(first_ce, first_raw),
            first_inc=first_inc, restored=inc.restored_from,
        )

    def _missing_rbf(self, inc: IncView, step: int) -> None:
        self._grow(MISSING_RBF, inc.number, step, WARNING, self._rbf_detail)

    def _rbf(self, inc: IncView, step: int) -> None:
        if not self._probe:
            self._probe = True
            for old in self._incs.values():  # closed before the run was known to log the probe
                if old.closed:
                    while old.pending_rbf:
                        self._missing_rbf(old, old.pending_rbf.popleft())
        inc.rbf_steps.add(step)
        if len(inc.rbf_steps) > 2048:  # only recent ones are ever looked up (probe before loss)
            inc.rbf_steps = {s for s in inc.rbf_steps if s > step - 1024}
        inc.last_rbf = step if inc.last_rbf is None else max(inc.last_rbf, step)
        while inc.pending_rbf and inc.pending_rbf[0] <= step:
            s = inc.pending_rbf.popleft()
            if s != step and s not in inc.rbf_steps:
                self._missing_rbf(inc, s)

    # -- details of range findings -------------------------------------------------------------
    @staticmethod
    def _nonfinite_detail(f: Finding) -> str:
        raws = ", ".join(sorted(f.extra["raws"]))
        return f"ce is not finite ({raws}) at {step_range(f.first_step, f.last_step)}"

    def _mismatch_detail(self, f: Finding) -> str:
        e = f.extra
        after = f" after the restore from step {e['restored']}" if e["restored"] is not None else ""
        return (
            f"{step_range(f.first_step, f.last_step)} replayed by incarnation {f.incarnation}{after} "
            f"differ from their first recording (incarnation {e['first_inc']}): largest |\u0394ce| "
            f"{e['worst']:.6f} at step {e['worst_step']} ({e['worst_ce']} vs {e['worst_first']}); "
            f"tolerance {self.settings.resume_tolerance:g}"
        )

    @staticmethod
    def _rbf_detail(f: Finding) -> str:
        return (
            f"REQUIRED_RBF missing at {step_range(f.first_step, f.last_step)} of incarnation "
            f"{f.incarnation} (LOSS-PARTS recorded; the run logs the probe)"
        )

    # -- bookkeeping ---------------------------------------------------------------------
    def _emit(self, kind: str, inc: int, first: int, last: int, detail: str, severity: str,
              now_ns: int | None = None) -> Finding | None:
        key = (self.run, kind, inc, first)
        if key in self.findings:
            return None
        f = Finding(kind, self.run, inc, first, last, detail, severity,
                    self.clock() if now_ns is None else now_ns)
        self.findings[key] = self._out[key] = f
        return f

    def _grow(self, kind: str, inc: int, step: int, severity: str, describe, **info) -> None:
        """Add one step to a range finding: extend the open range or open a new one."""
        f = self._ranges.get((kind, inc))
        if f is not None and step == f.last_step + 1:
            f.last_step = step
        else:
            f = self._emit(kind, inc, step, step, "", severity)
            if f is None:
                return
            f.extra = {"raws": set(), "worst": -1.0}
            self._ranges[(kind, inc)] = f
        if "raw" in info:
            f.extra["raws"].add(info["raw"])
        if "delta" in info:
            size = abs(info["delta"]) if info["delta"] == info["delta"] else float("inf")
            if size > f.extra["worst"]:
                f.extra.update(worst=size, worst_step=step, worst_ce=info["ce"], worst_first=info["first"])
            f.extra.update(first_inc=info["first_inc"], restored=info["restored"])
        f.detail = describe(f)
        self._out[f.key] = f

    def _flush(self) -> list[Finding]:
        # Snapshots: a range that grows later must not change what was already handed out.
        out = [replace(f, extra=dict(f.extra)) for f in self._out.values()]
        self._out = {}
        return out
