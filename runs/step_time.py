"""Step time per incarnation, as the detectors see it, and the `step_time_regression` finding's
decision and words (docs/goodput.md, docs/verdicts.md).

A step's time is its `completed step` line's `seconds:`, never more than the interval from the
line of the step before (as runs.goodput counts it); for an incarnation whose lines carry no
`seconds` at all, the interval between consecutive LOSS-PARTS stamps. The first step of an
incarnation (compilation) and the step after a checkpoint save are left out. Decided once per
incarnation, over its first DECIDE_AT such steps (so the verdict does not depend on how rows are
cut into batches), or at the end of the data over all of them when it has fewer."""

from __future__ import annotations

from array import array
from statistics import median

DECIDE_AT = 20  # steady steps an incarnation's median is decided on
MIN_STEPS = 3  # fewer steady steps than this: no median (not evaluable)
WARN_RATIO, CRITICAL_RATIO = 1.5, 5.0
LISTED = 6  # differing Config params named in the detail, at most


class IncTimes:
    """One incarnation's steady step times, from its `completed step` seconds or its stamps."""

    def __init__(self) -> None:
        self.seconds = array("d")
        self.stamps = array("d")
        self.has_seconds = False  # a `completed step` line with seconds was seen
        self.first_pod: int | None = None
        self.first_loss: int | None = None
        self.last: tuple[int, int] | None = None  # (step, ts_ns) of the latest stamped LOSS-PARTS
        self.last_pod: tuple[int, int] | None = None  # and of the latest stamped `completed step` line
        self.saves: set[int] = set()
        self.decided = False

    def pod(self, step: int, seconds: float | None, ts: int | None = None) -> None:
        if self.first_pod is None:
            self.first_pod = step
        last, self.last_pod = self.last_pod, ((step, ts) if ts is not None else None)
        if seconds is None:
            return
        self.has_seconds = True
        if last is not None and ts is not None and step > last[0] and ts >= last[1]:
            # no step outlasts the lines around it (as runs.goodput counts it)
            seconds = min(seconds, (ts - last[1]) / 1e9 / (step - last[0]))
        if step != self.first_pod and step - 1 not in self.saves:
            self.seconds.append(seconds)

    def loss(self, step: int, ts: int | None) -> None:
        if self.first_loss is None:
            self.first_loss = step
        if ts is None:
            return
        last, self.last = self.last, (step, ts)
        if last is not None and step == last[0] + 1 and ts >= last[1] and step - 1 not in self.saves:
            self.stamps.append((ts - last[1]) / 1e9)

    def samples(self) -> array:
        return self.seconds if self.has_seconds else self.stamps

    def ready(self) -> bool:
        """Enough steady steps to decide on, now."""
        return not self.decided and len(self.samples()) >= DECIDE_AT

    def median(self, first: int | None = None) -> float | None:
        values = self.samples()
        values = values if first is None else values[:first]
        return median(values) if len(values) >= MIN_STEPS else None


def severity_of(ratio: float) -> str | None:
    """"critical" from CRITICAL_RATIO x, "warning" from WARN_RATIO x, else None."""
    if ratio >= CRITICAL_RATIO:
        return "critical"
    if ratio >= WARN_RATIO:
        return "warning"
    return None


def config_diff(before: dict[str, str], now: dict[str, str]) -> list[str]:
    """The Config params whose values differ, as `name old -> new` (absent: `unset`)."""
    names = sorted(n for n in set(before) | set(now) if before.get(n) != now.get(n) and n != "run_name")
    return [f"{n} {before.get(n, 'unset')} -> {now.get(n, 'unset')}" for n in names]


def regression_detail(number: int, med: float, prev: int, prev_med: float, diff: list[str]) -> str:
    ratio = med / prev_med
    if diff:
        shown = "; ".join(diff[:LISTED]) + (f"; and {len(diff) - LISTED} more" if len(diff) > LISTED else "")
        cause = f"Config params that differ (the likely cause): {shown}"
    else:
        cause = "no Config param differs: look at the slice, the image or the input pipeline"
    return (f"incarnation {number}'s median step time is {med:.2f} s, {ratio:.1f}x incarnation {prev}'s "
            f"({prev_med:.2f} s); {cause}")


def control_detail(arm: str, inc: int, med: float, control: str, control_med: float, diff: list[str]) -> str:
    """The detail of a step_time_regression against a same-shape control run (`steptail compare`)."""
    ratio = med / control_med
    if diff:
        shown = "; ".join(diff[:LISTED]) + (f"; and {len(diff) - LISTED} more" if len(diff) > LISTED else "")
        cause = f"Config params that differ from the control (the likely cause): {shown}"
    else:
        cause = "no Config param differs from the control: look at the slice, the image or the input pipeline"
    return (f"{arm} incarnation {inc}'s median step time is {med:.2f} s, {ratio:.1f}x same-shape control "
            f"{control}'s ({control_med:.2f} s); {cause}")
