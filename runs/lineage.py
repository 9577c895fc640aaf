"""The final lineage of a run: for each step number, the execution whose result survives.

An execution of step s by incarnation k is thrown away when a later incarnation resumed at or
below s: it restored a checkpoint from before s (`restored_from` < s), or, its restore line not
read, its first recorded step is at or below s (docs/goodput.md). What survives of incarnation k
is therefore every step below the lowest resume point of the incarnations after it."""

from __future__ import annotations

from collections.abc import Iterable


def resume_point(first_step: int | None, restored_from: int | None) -> int | None:
    """The first step an incarnation ran: after its restored checkpoint when that was read
    (a missing head does not let the steps it redid survive), else its first recorded step."""
    points = [p for p in (first_step, None if restored_from is None else restored_from + 1) if p is not None]
    return min(points) if points else None


def survivor_bounds(incarnations: Iterable[tuple[int, int | None, int | None]]) -> dict[int, int | None]:
    """incarnation -> the step bound its executions survive below (None: all survive), from
    (incarnation, first_step, restored_from) of each incarnation."""
    bounds: dict[int, int | None] = {}
    cut = None
    for number, first, restored in sorted(incarnations, reverse=True):
        bounds[number] = cut
        point = resume_point(first, restored)
        if point is not None:
            cut = point if cut is None else min(cut, point)
    return bounds


def survives(bounds: dict[int, int | None], incarnation: int, step: int) -> bool:
    bound = bounds.get(incarnation)
    return bound is None or step < bound
