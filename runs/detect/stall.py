"""stall (warning): no new step for k x the median step time (--stall-k), never under
stall_min_seconds. Judged from the stamps when a step comes (live and offline), and from the
clock while a followed run is quiet (tick). The step after a checkpoint save is judged against
the longest such step so far: a save's own duration is learned from the run."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from steptail.runs.detect.base import Detector, IncView, as_int
from steptail.runs.findings import STALL, WARNING, knob


@dataclass
class StallSettings:
    stall_k: float = knob(3.0, "--stall-k", "Stall: no step for longer than k x the median step time.")
    stall_min_intervals: int = 5  # step intervals needed before the median means anything
    # and never a stall under this: stamps written in a burst make the median ~0 s, and then
    # any ordinary step would be "k x" it
    stall_min_seconds: float = 1.0


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


class Stall(Detector):
    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.median = RunningMedian()  # of the step intervals (lost steps share theirs)
        # the longest interval of a step right after a checkpoint save: the saves' own expected
        # duration, learned from the run (a maximum: it only grows, so a batch can be judged at once)
        self._save_max: float | None = None
        self._watching = True  # the stream is being read (the clock runs); see tick
        self._resumed_ns: int | None = None  # read again since the latest step: the wait starts here

    # -- a step comes ---------------------------------------------------------------------------
    def first_step(self, inc: IncView, step: int) -> None:
        self._resumed_ns = None

    def step(self, inc: IncView, step: int, ts: int | None) -> None:
        self._resumed_ns = None
        if ts is None or inc.last_ts is None or ts < inc.last_ts:
            return
        if step == inc.last_step + 1 and step - 1 in inc.saves:
            self._after_save(inc, step, ts)
            return
        settings = self.engine.settings
        per_step = (ts - inc.last_ts) / 1e9 / (step - inc.last_step)  # lost steps explain time
        known = self.median  # ready() inline: this runs for every step
        median = known.value() if known.count >= settings.stall_min_intervals else None
        if median is not None and per_step > max(settings.stall_k * median, settings.stall_min_seconds):
            nxt = inc.last_step + 1
            self.engine.emit(
                STALL, inc.number, nxt, nxt,
                f"step {step} came {(ts - inc.last_ts) / 1e9:.0f} s after step {inc.last_step} "
                f"({per_step:.1f} s per step; median step time {median:.1f} s, "
                f"k={settings.stall_k:g})",
                WARNING,
            )
        self.median.add(per_step)

    def _after_save(self, inc: IncView, step: int, ts: int) -> None:
        """The step after a save, judged against the longest such step so far (none yet: not
        evaluable, only learned), never below the steps' own threshold."""
        waited = (ts - inc.last_ts) / 1e9
        longest, median = self._save_max, self.ready()
        settings = self.engine.settings
        k = settings.stall_k
        if longest is not None:
            limit = max(k * longest, k * median if median is not None else 0.0, settings.stall_min_seconds)
            if waited > limit:
                nxt = inc.last_step + 1
                self.engine.emit(
                    STALL, inc.number, nxt, nxt,
                    f"step {step} came {waited:.0f} s after step {inc.last_step}, which saved a checkpoint "
                    f"(longest step after a save so far {longest:.1f} s, k={k:g})",
                    WARNING,
                )
        self._save_max = waited if longest is None else max(longest, waited)

    def steady(self, inc: IncView, steps: list[int], stamps: list[int | None],
               ces: list[float | None]) -> Callable[[], None] | None:
        """step() of consecutive new steps at once, when none of them can be a stall even at the
        lowest median the run can have by then (else None: row by row). The steps after a
        save are judged as _after_save does; here only if none is a stall."""
        if inc.last_ts is None or None in stamps:
            return None
        # (t - previous) / 1e9 / 1: what step() computes for consecutive steps
        per = [(b - a) / 1e9 for a, b in zip([inc.last_ts, *stamps[:-1]], stamps, strict=True)]
        if min(per) < 0:
            return None
        settings, m = self.engine.settings, len(steps)
        saves = inc.saves
        saved = [i for i, s in enumerate(steps) if s - 1 in saves] if saves else []
        longest = self._save_max
        if saved:
            for i in saved:
                if longest is not None and per[i] > max(settings.stall_k * longest, settings.stall_min_seconds):
                    return None
                longest = per[i] if longest is None else max(longest, per[i])
            skip = set(saved)
            per = [p for i, p in enumerate(per) if i not in skip]
            m -= len(saved)
        median = self.median
        checked = per[max(0, settings.stall_min_intervals - median.count):]
        if checked:
            floor = median.floor_while_adding(m)
            if floor is None or settings.stall_k < 0 \
                    or max(checked) > max(settings.stall_k * floor, settings.stall_min_seconds):
                return None

        def take() -> None:
            if saved:
                self._save_max = longest
            median.extend(per)
            self._resumed_ns = None
        return take

    def alone_first(self, left: int) -> int:
        """At the run's start, enough steps one by one for the intervals known to bound the
        median over the rest."""
        return (left - self.median.count + 3) // 2

    # -- the run is quiet ---------------------------------------------------------------------
    def tick(self, now_ns: int, running: bool, heard_ns: int | None, heard_stamp_ns: int | None) -> None:
        """No new step for k x the median step time, by the clock.

        Live, the follower says until when it knows the stream held back nothing: `heard_ns`,
        a look at the pod that found nothing unread (wall time), and `heard_stamp_ns`, the
        stamp of its latest line, which vouches for the stamps' distance past the last step
        (arrived late in a re-read's backlog, it is no quiet of the trainer's). Quiet after
        both is not yet the trainer's (a hung stream, a collector that was not running): the
        wait is counted up to them only, and what a re-read then delivers is judged by its
        stamps (step)."""
        e = self.engine
        inc = e.incarnations().get(e.current)
        median = self.ready()
        if not running:
            self._watching = False
            return
        if not self._watching:  # read again (a start, a take-over, a re-open): the wait starts now,
            self._watching = True  # not from a step stored before the stream was read
            if self._arrival() is not None:
                self._resumed_ns = max(self._arrival(), now_ns)
        arrival = self._arrival()
        if inc is None or inc.last_step is None or median is None or arrival is None:
            return
        planned = as_int(inc.config.get("steps"))
        if planned is not None and inc.last_step >= planned:
            return  # training finished
        until = now_ns if heard_ns is None and heard_stamp_ns is None else \
            min(now_ns, self._heard_until(inc, arrival, heard_ns, heard_stamp_ns))
        waited = (until - arrival) / 1e9
        expected = median
        if self._save_max is not None and inc.last_step in inc.saves:
            expected = max(median, self._save_max)  # saving a checkpoint: as long as the longest save so far
        settings = e.settings
        if waited > max(settings.stall_k * expected, settings.stall_min_seconds):
            nxt = inc.last_step + 1
            e.emit(
                STALL, inc.number, nxt, nxt,
                f"no new step for {waited:.0f} s after step {inc.last_step} (median step time "
                f"{median:.1f} s, k={settings.stall_k:g})",
                WARNING, now_ns,
            )

    def _arrival(self) -> int | None:
        """When the latest step was observed, or the stream read again since, if later."""
        return self._resumed_ns if self._resumed_ns is not None else self.engine.arrival_ns

    @staticmethod
    def _heard_until(inc: IncView, arrival: int, heard_ns: int | None, heard_stamp_ns: int | None) -> int:
        """Wall time up to which quiet is the trainer's (tick): a look's time, or the last
        step's arrival plus how far the latest line's stamp lies past that step's."""
        by_line = None
        if heard_stamp_ns is not None and inc.last_ts is not None:
            by_line = arrival + heard_stamp_ns - inc.last_ts
        return max((t for t in (heard_ns, by_line) if t is not None), default=arrival)

    def ready(self) -> float | None:
        """The median step time once it means anything (stall_min_intervals)."""
        if self.median.count < self.engine.settings.stall_min_intervals:
            return None
        return self.median.value()
