"""missing_rbf (warning): a LOSS-PARTS step whose REQUIRED_RBF never came, in a run that logs
the probe (one REQUIRED_RBF seen makes it known; a run that never prints it owes none). A
range finding: it grows one step at a time. Judged when a later REQUIRED_RBF passes the step,
the incarnation is superseded, or the data ends (the last step's may still be on its way)."""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice
from operator import itemgetter

from steptail.runs.detect.base import Detector, IncView
from steptail.runs.findings import MISSING_RBF, WARNING, Finding, step_range
from steptail.runs.rows import REQUIRED_RBF

_RBF_STEP = itemgetter(REQUIRED_RBF.STEP)
STEADY_MIN = 32  # rows below which the one-by-one path costs less than the bulk checks
KEEP = 2048  # REQUIRED_RBF steps remembered per incarnation: only recent ones are looked up


@dataclass
class Owed:
    """One incarnation's REQUIRED_RBF bookkeeping."""

    last: int | None = None  # highest REQUIRED_RBF step seen
    seen: set[int] = field(default_factory=set)  # recent REQUIRED_RBF steps (probe before loss)
    pending: deque[int] = field(default_factory=deque)  # LOSS-PARTS steps awaiting theirs


class MissingRbf(Detector):
    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.probe = False  # the run logs REQUIRED_RBF
        self.owed: dict[int, Owed] = {}  # per incarnation

    def _of(self, inc: IncView) -> Owed:
        o = self.owed.get(inc.number)
        if o is None:
            o = self.owed[inc.number] = Owed()
        return o

    # -- LOSS-PARTS ------------------------------------------------------------------------------
    def recorded(self, inc: IncView, step: int) -> None:
        o = self._of(inc)
        if step in o.seen:
            pass
        elif o.last is not None and step < o.last:
            if self.probe:  # REQUIRED_RBF printed before LOSS-PARTS and this one never came
                self._missing(inc, step)
        else:
            o.pending.append(step)

    def steady(self, inc: IncView, steps: list[int], stamps: list[int | None],
               ces: list[float | None]) -> Callable[[], None] | None:
        """New steps above every REQUIRED_RBF seen: each awaits its own."""
        o = self._of(inc)
        if o.last is not None and o.last >= steps[0]:
            return None
        return lambda: o.pending.extend(steps)

    # -- REQUIRED_RBF ----------------------------------------------------------------------------
    def after_losses(self, inc: IncView, rows: dict[str, list]) -> None:
        """rbf() of each row; a steady run of them at once (_steady), tried again after the
        first row (which may make the probe known) went alone."""
        rbf = rows["required_rbf"]
        step_at = REQUIRED_RBF.STEP
        if len(rbf) < STEADY_MIN:  # the live path's usual batch: a row or a few
            for row in rbf:
                self.rbf(inc, row[step_at])
            return
        if self._steady(inc, rbf):
            return
        self.rbf(inc, rbf[0][step_at])
        if self._steady(inc, rbf[1:]):
            return
        for row in islice(rbf, 1, None):
            self.rbf(inc, row[step_at])

    def rbf(self, inc: IncView, step: int) -> None:
        if not self.probe:
            self.probe = True
            for old in self.engine.incarnations().values():  # closed before the run was known to log it
                if old.closed:
                    pending = self._of(old).pending
                    while pending:
                        self._missing(old, pending.popleft())
        o = self._of(inc)
        o.seen.add(step)
        if len(o.seen) > KEEP:
            o.seen = {s for s in o.seen if s > step - KEEP // 2}
        o.last = step if o.last is None else max(o.last, step)
        while o.pending and o.pending[0] <= step:
            s = o.pending.popleft()
            if s != step and s not in o.seen:
                self._missing(inc, s)

    def _steady(self, inc: IncView, rows: list[tuple]) -> int:
        """rbf() of a steady run of rows at once (how many were taken, 0 if none): the probe
        known, every step the next one, each the oldest LOSS-PARTS step awaiting it (so none
        goes missing)."""
        if not self.probe:
            return 0
        o = self._of(inc)
        steps = list(map(_RBF_STEP, rows))
        first, m = steps[0], len(steps)
        pending = o.pending
        if (o.last is not None and o.last >= first) or len(pending) < m \
                or pending[0] != first or steps != list(range(first, first + m)) \
                or list(islice(pending, m)) != steps:
            return 0
        for _ in steps:
            pending.popleft()
        # The set as rbf() leaves it (its content is state): rbf() keeps the steps above
        # step - 1024 whenever an add makes it hold 2049. Every step added here is above
        # those already in it, so only the last such cut decides what stays.
        old = sorted(o.seen)
        size, cut, added = len(old), None, 0
        while added + KEEP + 1 - size <= m:
            added += KEEP + 1 - size
            cut = steps[added - 1] - KEEP // 2
            size = len(old) - bisect_right(old, cut) + steps[added - 1] - max(cut + 1, first) + 1
        if cut is None:
            o.seen.update(steps)
        else:
            o.seen = set(old[bisect_right(old, cut):]) | set(range(max(cut + 1, first), first + m))
        o.last = steps[-1]
        return m

    # -- owed for good -----------------------------------------------------------------------------
    def closed(self, inc: IncView) -> None:
        if self.probe:
            pending = self._of(inc).pending
            while pending:
                self._missing(inc, pending.popleft())

    def finish(self) -> None:
        if not self.probe:
            return
        e = self.engine
        for inc in e.incarnations().values():
            o = self._of(inc)
            final = inc.number == e.current
            pending = list(o.pending)
            if final and pending and pending[-1] == inc.last_step:
                pending.pop()  # its REQUIRED_RBF may still be on its way
            for s in pending:
                self._missing(inc, s)
            o.pending = deque(s for s in o.pending if s not in pending)

    def _missing(self, inc: IncView, step: int) -> None:
        self.engine.grow(MISSING_RBF, inc.number, step, WARNING, _detail)


def _detail(f: Finding) -> str:
    return (
        f"REQUIRED_RBF missing at {step_range(f.first_step, f.last_step)} of incarnation "
        f"{f.incarnation} (LOSS-PARTS recorded; the run logs the probe)"
    )
