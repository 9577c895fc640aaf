"""Missing steps: the one definition. The gap detectors (`check`, `follow`), the export
manifest and the API's gaps come from here; the dashboards' missing-steps alert SQL is held to
it by tests/test_missing_step_definition.py.

A step is missing when an incarnation skips it between two recorded LOSS-PARTS steps ("gap"),
or when the trainer's start-up was read yet the incarnation's first step comes after the step
following its restored checkpoint (step 1 without a restore): "head_gap". Where following
began mid-way (no start-up read), what came before is unread, not missing."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

GAP, HEAD_GAP = "gap", "head_gap"


@dataclass(frozen=True)
class StepGap:
    kind: str  # GAP or HEAD_GAP, also the kind of the finding that reports it
    incarnation: int
    first_step: int
    last_step: int

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
            first_step: int | None) -> StepGap | None:
    """The steps missing before an incarnation's first recorded step."""
    if not saw_start or first_step is None:
        return None
    expected = 1 if restored_from is None else restored_from + 1
    if first_step > expected:
        return StepGap(HEAD_GAP, incarnation, expected, first_step - 1)
    return None


def missing_steps(steps: Iterable[tuple[int, int]],
                  heads: Iterable[tuple[int, bool, int | None, int | None]]) -> list[StepGap]:
    """Every gap of a run, by incarnation and first step. `steps`: (incarnation, step) of its
    LOSS-PARTS rows ordered by incarnation, step; `heads`: (incarnation, saw_start,
    restored_from, first_step) of its incarnations."""
    found = []
    prev_inc = prev_step = None
    for inc, step in steps:
        if inc == prev_inc and (gap := between(inc, prev_step, step)) is not None:
            found.append(gap)
        prev_inc, prev_step = inc, step
    found += [g for g in (at_head(*h) for h in heads) if g is not None]
    return sorted(found, key=lambda g: (g.incarnation, g.first_step))
