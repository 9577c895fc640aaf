"""Missing steps: the one definition. The gap detectors (`check`, `follow`), the export
manifest and the API's gaps come from here; the dashboards' missing-steps alert SQL is held to
it by tests/test_missing_step_definition.py.

A step is missing when an incarnation skips it between two recorded LOSS-PARTS steps ("gap"),
or when it comes before the incarnation's first recorded step and after the step the
incarnation is known to start from ("head_gap"):

- the trainer's start-up or a restore line was read: step 1, or the step after the restored
  checkpoint (a first step at or before it is a replay: nothing missing);
- neither was read (following began late, the head of the log rotated away, a saved log that
  starts mid-way): the step after the highest checkpoint an earlier incarnation saved (a restart
  resumes from the latest checkpoint, so its replay of the steps after it is this incarnation's
  too); none read while an earlier incarnation's own head was not read either (its saves
  unknown): step 1; none read while the run's config names its `checkpoint_period`: the step
  after the last multiple of it that the earlier incarnations reached (a trainer that has not
  reached its first save restarts from step 1); else after the highest step recorded before
  this incarnation (step 1 for the run's first). The steps in between were not read: lost, or run before a restart from a
  checkpoint whose restore line was lost too — the log read cannot say which, so they count as
  missing (`unread` says so). A first step at or before that point is a restart from a
  checkpoint whose restore line was lost: nothing is known to be missing."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from steptail.parsers.numbers import parse_integer
from steptail.runs.findings import GAP, HEAD_GAP

PERIOD_PARAM = "checkpoint_period"  # MaxText's config: a checkpoint every this many steps


@dataclass(frozen=True)
class StepGap:
    kind: str  # GAP or HEAD_GAP, also the kind of the finding that reports it
    incarnation: int
    first_step: int
    last_step: int
    unread: bool = False  # a head gap whose start-up and restore lines were not read

    @property
    def count(self) -> int:
        return self.last_step - self.first_step + 1

    def to_dict(self) -> dict:
        """The fields of the export manifest's gaps.steps, in its order."""
        return {"incarnation": self.incarnation, "first_step": self.first_step,
                "last_step": self.last_step, "kind": self.kind}


def between(incarnation: int, step: int, next_step: int) -> StepGap | None:
    """The steps missing between two consecutive recorded steps of one incarnation."""
    if next_step > step + 1:
        return StepGap(GAP, incarnation, step + 1, next_step - 1)
    return None


def at_head(incarnation: int, saw_start: bool, restored_from: int | None,
            first_step: int | None, before: int | None = None, saved: int | None = None) -> StepGap | None:
    """The steps missing before an incarnation's first recorded step; `before`: the highest
    step recorded by the run's earlier incarnations, `saved`: the highest checkpoint they saved
    (None: none)."""
    if first_step is None:
        return None
    unread = not saw_start and restored_from is None
    if unread:
        after = saved if saved is not None else (before or 0)
    else:
        after = restored_from or 0  # restored from 0: a fresh start
    if first_step > after + 1:
        return StepGap(HEAD_GAP, incarnation, after + 1, first_step - 1, unread)
    return None


def checkpoint_period(value: str | None) -> int | None:
    """The config's checkpoint period as a positive int of at most 9 digits (None: absent, 0,
    negative, absurd or not a number; the dashboards' alert SQL reads it the same way)."""
    period = None if value is None else parse_integer(str(value).strip())
    return period if period is not None and 0 < period < 10**9 else None


def resumed_after(saves: Iterable[int], unread_head_before: bool, before: int | None = None,
                  period: int | None = None) -> int | None:
    """The lowest checkpoint a restart whose start-up and restore lines were not read can have
    resumed from (at_head's `saved`): the highest save its earlier incarnations printed; with
    none read, 0 when one of them had an unread head (a save may have been in it); else, with
    the run's checkpoint `period` known, the last multiple of it at or below `before` (their
    highest step: 0 before the first save, so a restart from scratch loses its head too); else
    None (nothing known: the trainer may print no saves)."""
    highest = max(saves, default=None)
    if highest is None and unread_head_before:
        return 0
    if highest is None and period and before is not None:
        return before // period * period
    return highest


def missing_steps(steps: Iterable[tuple[int, int]],
                  heads: Iterable[tuple[int, bool, int | None, int | None]],
                  saves: Iterable[tuple[int, int]] = (),
                  periods: Iterable[tuple[int, int]] = ()) -> list[StepGap]:
    """Every gap of a run, by incarnation and first step. `steps`: (incarnation, step) of its
    LOSS-PARTS rows ordered by incarnation, step; `heads`: (incarnation, saw_start,
    restored_from, first_step) of its incarnations; `saves`: (incarnation, step) of its
    checkpoint saves; `periods`: (incarnation, checkpoint period) from its config."""
    saves, periods = list(saves), sorted(periods)
    found = []
    highest: dict[int, int] = {}  # incarnation -> its highest step
    prev_inc = prev_step = None
    for inc, step in steps:
        if inc == prev_inc and (gap := between(inc, prev_step, step)) is not None:
            found.append(gap)
        prev_inc, prev_step = inc, step
        highest[inc] = step
    heads = sorted(heads)
    unread = {inc for inc, saw_start, restored_from, first_step in heads
              if first_step is not None and not saw_start and restored_from is None}
    for inc, saw_start, restored_from, first_step in heads:
        before = max((s for i, s in highest.items() if i < inc), default=None)
        period = next((p for i, p in reversed(periods) if i <= inc), None)
        saved = resumed_after((s for i, s in saves if i < inc), any(i < inc for i in unread), before, period)
        if (gap := at_head(inc, saw_start, restored_from, first_step, before, saved)) is not None:
            found.append(gap)
    return sorted(found, key=lambda g: (g.incarnation, g.first_step))
