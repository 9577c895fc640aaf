"""resume_mismatch (critical): a step replayed by a later incarnation (after a restart from a
checkpoint) whose CE differs from its first recording by more than --resume-tolerance. A range
finding: it grows one step at a time, naming the largest difference."""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable
from dataclasses import dataclass

from steptail.runs.detect.base import Detector, IncView, fmt_ce
from steptail.runs.findings import CRITICAL, RESUME_MISMATCH, Finding, knob, step_range


@dataclass
class ResumeSettings:
    resume_tolerance: float = knob(1e-4, "--resume-tolerance",
                                   "Resume mismatch: largest allowed |replayed ce - first recording|.")


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

    def fits(self, first: int, m: int) -> bool:
        """Whether steps first .. first + m - 1 fit the dense part (add_run takes them)."""
        return first >= 0 and first + m <= self.DENSE_LIMIT

    def add_run(self, first: int, inc: int, ces: list[float]) -> bool:
        """add() of steps first, first + 1, ... with these finite ce values, when all fit the
        dense part; False (nothing added) otherwise."""
        end = first + len(ces)
        if not self.fits(first, len(ces)):
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


class ResumeMismatch(Detector):
    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.first = FirstRecordings()  # every step's first recording, for the whole run

    def loss(self, inc: IncView, step: int, ce: float | None, raw: str) -> None:
        first = self.first.get(step)
        if first is None:
            self.first.add(step, inc.number, ce, raw)
        elif first[0] != inc.number:
            self._replay(inc, step, ce, raw, first)

    def steady(self, inc: IncView, steps: list[int], stamps: list[int | None],
               ces: list[float | None]) -> Callable[[], None] | None:
        """New steps (none recorded before) with finite CE: their first recordings, at once."""
        first, m = steps[0], len(steps)
        if None in ces or not self.first.fits(first, m):
            return None
        return lambda: self.first.add_run(first, inc.number, ces)

    def _replay(self, inc: IncView, step: int, ce: float | None, raw: str, first: tuple) -> None:
        first_inc, first_ce, first_raw = first
        if ce is None and first_ce is None:
            return
        if ce is not None and first_ce is not None:
            delta = ce - first_ce
            if abs(delta) <= self.engine.settings.resume_tolerance:
                return
        else:
            delta = float("nan")
        ce_text, first_text = fmt_ce(ce, raw), fmt_ce(first_ce, first_raw)

        def note(extra: dict) -> None:
            size = abs(delta) if delta == delta else float("inf")
            if size > extra.get("worst", -1.0):
                extra.update(worst=size, worst_step=step, worst_ce=ce_text, worst_first=first_text)
            extra.update(first_inc=first_inc, restored=inc.restored_from)

        self.engine.grow(RESUME_MISMATCH, inc.number, step, CRITICAL, self._detail, note)

    def _detail(self, f: Finding) -> str:
        e = f.extra
        after = f" after the restore from step {e['restored']}" if e["restored"] is not None else ""
        return (
            f"{step_range(f.first_step, f.last_step)} replayed by incarnation {f.incarnation}{after} "
            f"differ from their first recording (incarnation {e['first_inc']}): largest |\u0394ce| "
            f"{e['worst']:.6f} at step {e['worst_step']} ({e['worst_ce']} vs {e['worst_first']}); "
            f"tolerance {self.engine.settings.resume_tolerance:g}"
        )
