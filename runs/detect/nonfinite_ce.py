"""nonfinite_ce (critical): a LOSS-PARTS step whose CE is not a finite number (nan, inf). A
range finding: it grows one step at a time, naming the tokens the log printed."""

from __future__ import annotations

from collections.abc import Callable

from steptail.runs.detect.base import Detector, IncView, take_nothing
from steptail.runs.findings import CRITICAL, NONFINITE_CE, Finding, step_range


class NonFiniteCe(Detector):
    def loss(self, inc: IncView, step: int, ce: float | None, raw: str) -> None:
        if ce is None:
            self.engine.grow(NONFINITE_CE, inc.number, step, CRITICAL, _detail,
                             lambda extra: extra.setdefault("raws", set()).add(raw))

    def steady(self, inc: IncView, steps: list[int], stamps: list[int | None],
               ces: list[float | None]) -> Callable[[], None] | None:
        return None if None in ces else take_nothing


def _detail(f: Finding) -> str:
    raws = ", ".join(sorted(f.extra["raws"]))
    return f"ce is not finite ({raws}) at {step_range(f.first_step, f.last_step)}"
