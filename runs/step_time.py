"""Step time per incarnation, as the detectors see it, and the `step_time_regression` finding's
decision and words (docs/goodput.md, docs/verdicts.md).

A step's time is its `completed step` line's `seconds:`; for an incarnation whose lines carry no
`seconds` at all, the interval between consecutive LOSS-PARTS stamps. The first step of an
incarnation (compilation) and the step after a checkpoint save are left out. Stamps are read over
WINDOW steps at a time: lines that reach the kubelet in a burst (buffered stdout, a lagging pipe)
share a stamp, so one step's own interval says nothing, while a window's mean does. The median of
`seconds` is capped by the median window of its lines' stamps, so a trainer clock unlike the
kubelet's cannot fake a regression. Decided once per incarnation, over its first DECIDE_AT such
steps (so the verdict does not depend on how rows are cut into batches), or at the end of the data
over all of them when it has fewer."""

from __future__ import annotations

from array import array
from statistics import median

DECIDE_AT = 20  # steady steps an incarnation's median is decided on
MIN_STEPS = 3  # fewer steady steps than this: no median (not evaluable)
RESOLUTION_S = 0.01  # step times the stamps can compare (a pipe's delay and bursts are ms)
WINDOW = 5  # steps whose stamp intervals are averaged together (a burst of lines shares a stamp)
WARN_RATIO, CRITICAL_RATIO = 1.5, 5.0
LISTED = 6  # differing Config params named in the detail, at most


class IncTimes:
    """One incarnation's steady step times, from its `completed step` seconds or its stamps."""

    def __init__(self) -> None:
        self.seconds = array("d")
        self.stamps = array("d")  # LOSS-PARTS stamp intervals of steady steps
        self.pod_stamps = array("d")  # and of `completed step` lines, which cap `seconds`
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
        if self._steady(step, last, ts):
            self.pod_stamps.append((ts - last[1]) / 1e9)
        if seconds is None:
            return
        self.has_seconds = True
        if step != self.first_pod and step - 1 not in self.saves:
            self.seconds.append(seconds)

    def loss(self, step: int, ts: int | None) -> None:
        if self.first_loss is None:
            self.first_loss = step
        if ts is None:
            return
        last, self.last = self.last, (step, ts)
        if self._steady(step, last, ts):
            self.stamps.append((ts - last[1]) / 1e9)

    def _steady(self, step: int, last: tuple[int, int] | None, ts: int | None) -> bool:
        """The interval from `last` to this line is one steady step's."""
        return last is not None and ts is not None and step == last[0] + 1 and ts >= last[1] \
            and step - 1 not in self.saves

    def samples(self) -> array:
        return self.seconds if self.has_seconds else self.stamps

    def ready(self) -> bool:
        """Enough steady steps to decide on, now."""
        return not self.decided and len(self.samples()) >= DECIDE_AT

    def median(self, first: int | None = None) -> float | None:
        if not self.has_seconds:
            return windowed_median(self.stamps[:first])
        values = self.seconds[:first]
        if len(values) < MIN_STEPS:
            return None
        cap = windowed_median(self.pod_stamps[:first])
        return median(values) if cap is None else min(median(values), cap)


def windowed_median(intervals: array) -> float | None:
    """The median over runs of WINDOW consecutive intervals of their mean (one mean of all when
    fewer): a burst's near-zero intervals and the long one before it average out, and one slow
    step (a stall) lifts at most WINDOW of the means, not the median."""
    if len(intervals) < MIN_STEPS:
        return None
    width = min(WINDOW, len(intervals))
    total = sum(intervals[:width])
    means = [total / width]
    for i in range(width, len(intervals)):
        total += intervals[i] - intervals[i - width]
        means.append(total / width)
    return median(means)


def regression_severity(med: float, prev_med: float) -> str | None:
    """severity_of(med / prev_med); None when the earlier median is under RESOLUTION_S: lines
    are stamped as the runtime reads the container's pipe, milliseconds late and in bursts, so
    a ratio over a step of a few milliseconds measures the pipe, not the trainer."""
    return severity_of(med / prev_med) if prev_med >= RESOLUTION_S else None


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
