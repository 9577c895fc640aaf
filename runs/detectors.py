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

import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import replace
from itertools import islice
from operator import itemgetter

from steptail.parsers import format_ns
from steptail.runs.detect import DETECTORS, Detector, Settings
from steptail.runs.detect.base import CP_PARAM, IncView, as_int
from steptail.runs.findings import (
    NO_INCARNATION,
    NO_STEP,
    UNREAD_TAIL,
    UNREADABLE_LOG,
    WARNING,
    Finding,
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
)
from steptail.runs.stream_gap import StreamGap

_INCARNATION = itemgetter(INCARNATION)
_LOSS_STEP, _LOSS_TS, _LOSS_CE = itemgetter(LOSS_PARTS.STEP), itemgetter(LOSS_PARTS.TS_NS), itemgetter(LOSS_PARTS.CE)
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


class FindingEngine:
    """The loop over a run's rows: it keeps each incarnation's place (IncView), finds the
    gaps between and before its steps (they need the stream gaps and the other rules: an
    unread head tells them), and asks the plug-ins (runs/detect) in turn; the Engine they
    are given is this object."""

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
        self._max_step: int | None = None
        self._cp: int | None = None  # latest ici_context_parallelism seen
        self.arrival_ns: int | None = None  # clock when the latest step was observed
        self._gaps: list[StreamGap] = []
        self._ranges: dict[tuple[str, int], Finding] = {}
        self._out: dict[tuple, Finding] = {}
        self._detectors = [cls(self) for cls in detectors]
        # The hooks asked per batch, per row or per tick go only to the plug-ins answering them.
        self._stepwise, self._judging, self._recording, self._ticking, self._taking, self._after, self._feeding, \
            self._alone = (self._answering(hook) for hook in
                           ("step", "loss", "recorded", "tick", "steady", "after_losses", "rows", "alone_first"))

    def _answering(self, hook: str) -> list[Detector]:
        return [d for d in self._detectors if getattr(type(d), hook) is not getattr(Detector, hook)]

    # -- what a plug-in detector is given (runs.detect.base.Engine) --------------------------
    def emit(self, kind: str, inc: int, first: int, last: int, detail: str, severity: str,
             now_ns: int | None = None) -> Finding | None:
        return self._emit(kind, inc, first, last, detail, severity, now_ns)

    def changed(self, f: Finding) -> None:
        self._out[f.key] = f

    def grow(self, kind: str, inc: int, step: int, severity: str, describe: Callable[[Finding], str],
             note: Callable[[dict], None] | None = None) -> None:
        self._grow(kind, inc, step, severity, describe, note)

    def incarnations(self) -> dict[int, IncView]:
        return self._incs

    @property
    def max_step(self) -> int | None:
        return self._max_step

    @property
    def cp(self) -> int | None:
        return self._cp

    @property
    def current(self) -> int:
        return self._current

    def detector(self, cls: type[Detector]) -> Detector | None:
        """The plug-in of that class this engine runs, if any."""
        return next((d for d in self._detectors if type(d) is cls), None)

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
            for d in self._feeding:
                d.rows(inc, rows)
            self._losses(inc, rows["loss_parts"])
            for d in self._after:
                d.after_losses(inc, rows)
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
        """Live checks from the clock (a stall: runs.detect.stall): the follower reads the
        stream (`running`) and knows nothing was held back up to `heard_ns` (a look at the
        pod, wall time) or its latest line's stamp (`heard_stamp_ns`)."""
        for d in self._ticking:
            d.tick(now_ns, running, heard_ns, heard_stamp_ns)
        return self._flush()

    def finish(self) -> list[Finding]:
        """End-of-data checks: each plug-in's (REQUIRED_RBF still owed first)."""
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
        for d in self._detectors:
            d.closed(inc)

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
            for d in self._stepwise:
                d.step(inc, step, ts)
        else:
            return  # not a new step of this incarnation (the model never sends one)
        for d in self._judging:
            d.loss(inc, step, ce, ce_raw)
        if step == 1:
            for d in self._detectors:
                d.step_one(inc, ce, ce_raw)
        for d in self._recording:
            d.recorded(inc, step)
        inc.last_step, inc.last_ts = step, ts
        if self._max_step is None or step > self._max_step:
            self._max_step = step
        self.arrival_ns = self.clock()

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
            top, stop = self._max_step, i + max([1, *(d.alone_first(n - i) for d in self._alone)])
            while i < n and (i < stop or (top is not None and rows[i][step_at] <= top)):
                row = rows[i]
                self._loss(inc, row[step_at], row[ts_at], row[ce_at], row[raw_at])
                i += 1
        for row in islice(rows, i, None):
            self._loss(inc, row[step_at], row[ts_at], row[ce_at], row[raw_at])

    def _steady_losses(self, inc: IncView, rows: list[tuple]) -> int:
        """_loss() of a steady run of rows at once: how many rows (a prefix) were taken, 0 if
        none. Steady: every step the next one, first recorded here (no replay), not step 1,
        and every plug-in able to take them at once (a finite ce; a stall: no interval long
        enough even at the lowest median the run can have by then; no REQUIRED_RBF seen for
        them yet).
        Anything else is left to _loss, row by row: no finding comes from here."""
        last = inc.last_step
        if last is None or self._max_step is None:
            return 0
        steps = list(map(_LOSS_STEP, rows))
        first, m = steps[0], len(steps)
        if first != last + 1 or first <= 1 or first <= self._max_step \
                or steps != list(range(first, first + m)):
            return 0
        stamps, ces = list(map(_LOSS_TS, rows)), list(map(_LOSS_CE, rows))
        takes = []
        for d in self._taking:
            take = d.steady(inc, steps, stamps, ces)
            if take is None:
                return 0
            takes.append(take)
        for take in takes:
            take()
        inc.last_step, inc.last_ts = steps[-1], stamps[-1]
        self._max_step = steps[-1]
        clock = self.clock
        if clock is time.time_ns:
            self.arrival_ns = clock()
        else:  # as often as _loss reads it (a test's clock may count)
            for _ in steps:
                self.arrival_ns = clock()
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

    def _grow(self, kind: str, inc: int, step: int, severity: str, describe: Callable[[Finding], str],
              note: Callable[[dict], None] | None = None) -> None:
        """Add one step to a range finding: extend the open range or open a new one; `note`
        updates the detector's state kept on it (Finding.extra), `describe` its detail."""
        f = self._ranges.get((kind, inc))
        if f is not None and step == f.last_step + 1:
            f.last_step = step
        else:
            f = self._emit(kind, inc, step, step, "", severity)
            if f is None:
                return
            self._ranges[(kind, inc)] = f
        if note is not None:
            note(f.extra)
        f.detail = describe(f)
        self._out[f.key] = f

    def _flush(self) -> list[Finding]:
        # Snapshots: a range that grows later must not change what was already handed out.
        out = [replace(f, extra=dict(f.extra)) for f in self._out.values()]
        self._out = {}
        return out
