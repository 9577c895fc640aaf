"""Step time per incarnation, as the detectors see it, and the `step_time_regression` finding's
decision and words (docs/goodput.md, docs/verdicts.md).

A step's time is its `completed step` line's `seconds:`, never more than the interval from the
line before it, as runs.goodput counts it (so a trainer clock unlike the kubelet's cannot fake a
regression); for an incarnation whose lines carry no `seconds` at all, the interval between
consecutive LOSS-PARTS stamps. Lines stamped under 1 ms apart (runs.goodput.same_burst)
reached the kubelet in one burst (a buffered stdout, a lagging pipe): their own interval is no
step's, so the steps of a burst share the interval from the line before it. The first step of an incarnation
(compilation) and the step after a checkpoint save are left out. Decided once per incarnation,
over its first DECIDE_AT such steps (so the verdict does not depend on how rows are cut into
batches), or at the end of the data over all of them when it has fewer."""

from __future__ import annotations

from array import array
from statistics import median

from steptail.runs.goodput import BURST_NS, same_burst

DECIDE_AT = 20  # steady steps an incarnation's median is decided on
MIN_STEPS = 3  # fewer steady steps than this: no median (not evaluable)
RESOLUTION_S = 0.01  # step times the stamps can compare (a pipe's delay and bursts are ms)
WARN_RATIO, CRITICAL_RATIO = 1.5, 5.0
LISTED = 6  # differing Config params named in the detail, at most
BULK = 64  # rows from which a batch's step times are taken in numpy
_SAFE = 2**62


class IncTimes:
    """One incarnation's steady step times, from its `completed step` seconds or its stamps."""

    def __init__(self) -> None:
        self.seconds = array("d")
        self.stamps = array("d")  # LOSS-PARTS stamp intervals of steady steps, bursts shared out
        self.has_seconds = False  # a `completed step` line with seconds was seen
        self.first_pod: int | None = None
        self.first_loss: int | None = None
        self.last: tuple[int, int] | None = None  # (step, ts_ns) of the latest stamped LOSS-PARTS
        self.anchor: tuple[int, int] | None = None  # and of the one before its burst
        self.burst: list[int] = []  # the steps of the latest burst, whose interval is not known yet
        self.last_pod: tuple[int, int] | None = None  # (step, ts_ns) of the latest `completed step` line
        self.pod_anchor: tuple[int, int] | None = None  # and of the one before its burst
        self.saves: set[int] = set()
        self.decided = False

    def pod(self, step: int, seconds: float | None, ts: int | None = None) -> None:
        if self.first_pod is None:
            self.first_pod = step
        last, self.last_pod = self.last_pod, ((step, ts) if ts is not None else None)
        if not same_burst(last[1] if last is not None else None, ts):  # as runs.goodput anchors its cap
            self.pod_anchor = last
        if seconds is None:
            return
        self.has_seconds = True
        anchor = self.pod_anchor
        if anchor is not None and ts is not None and step > anchor[0] and ts >= anchor[1]:
            # no step outlasts the lines around it (as runs.goodput counts it)
            seconds = min(seconds, (ts - anchor[1]) / 1e9 / (step - anchor[0]))
        if step != self.first_pod and step - 1 not in self.saves:
            self.seconds.append(seconds)

    def pods(self, steps: list, seconds: list, stamps: list) -> None:
        """pod() for each row, in order: in numpy for a bulk batch (the same operations; an
        ingest feeds every `completed step` row here, ~1 µs each as a loop)."""
        held = [*(self.last_pod or ()), *(self.pod_anchor or ())]
        if len(steps) < BULK or not _fits([*steps, *held]) or not _fits([t for t in stamps if t is not None]):
            for row in zip(steps, seconds, stamps, strict=True):
                self.pod(*row)
            return
        import numpy as np  # here, not at the top: every command imports this module, few batch

        n = len(steps)
        step = np.array(steps, dtype=np.int64)
        has_ts = np.fromiter((t is not None for t in stamps), bool, n)
        ts = np.array([0 if t is None else t for t in stamps], dtype=np.int64)
        # the line before each row, as `last_pod` holds it: None when it had no stamp
        p_has = np.r_[self.last_pod is not None, has_ts[:-1]]
        p_step = np.r_[self.last_pod[0] if self.last_pod else 0, step[:-1]]
        p_ts = np.r_[self.last_pod[1] if self.last_pod else 0, ts[:-1]]
        gap = ts - p_ts
        burst = p_has & has_ts & (gap >= 0) & (gap < BURST_NS)
        # a row's anchor: the line before the last row that began no burst (or the one kept)
        began = np.where(~burst, np.arange(n), -1)
        np.maximum.accumulate(began, out=began)
        at = np.maximum(began, 0)
        a_has, a_step, a_ts = p_has[at].copy(), p_step[at].copy(), p_ts[at].copy()
        kept = began < 0
        a_has[kept] = self.pod_anchor is not None
        if self.pod_anchor is not None:
            a_step[kept], a_ts[kept] = self.pod_anchor
        if self.first_pod is None:
            self.first_pod = steps[0]
        self.last_pod = (steps[-1], stamps[-1]) if stamps[-1] is not None else None
        last = n - 1
        self.pod_anchor = (int(a_step[last]), int(a_ts[last])) if a_has[last] else None
        known = np.fromiter((s is not None for s in seconds), bool, n)
        if not known.any():
            return
        self.has_seconds = True
        secs = np.array(seconds, dtype=np.float64)  # None: NaN, and not `known`
        capped = known & a_has & has_ts & (step > a_step) & (ts >= a_ts)
        cap = np.full(n, np.inf)
        cap[capped] = (ts[capped] - a_ts[capped]).astype(np.float64) / 1e9 / \
            (step[capped] - a_step[capped]).astype(np.float64)
        secs = np.where(cap < secs, cap, secs)  # min(seconds, cap), as Python's min takes it
        keep = known & (step != self.first_pod)
        if self.saves:
            keep &= ~np.isin(step - 1, np.fromiter(self.saves, np.int64, len(self.saves)))
        self.seconds.extend(secs[keep].tolist())

    def loss(self, step: int, ts: int | None) -> None:
        if self.first_loss is None:
            self.first_loss = step
        if ts is None:
            return
        last, self.last = self.last, (step, ts)
        if _in_burst(last, step, ts):
            self.burst.append(step)
            return
        self._close_burst(last)
        if last is not None and step == last[0] + 1 and ts >= last[1]:
            self.anchor, self.burst = last, [step]
        else:
            self.anchor, self.burst = None, []  # not the next step, or stamped before it: no interval

    def close(self) -> None:
        """The end of the data: the latest burst is complete."""
        self._close_burst(self.last)

    def _close_burst(self, end: tuple[int, int] | None) -> None:
        """The latest burst's steps (its last line `end`), each the burst's interval shared out,
        as steady samples."""
        anchor, burst, self.burst = self.anchor, self.burst, []
        if anchor is None or not burst or end is None:
            return
        per = (end[1] - anchor[1]) / 1e9 / len(burst)
        for step in burst:
            if step - 1 not in self.saves:
                self.stamps.append(per)

    def samples(self) -> array:
        return self.seconds if self.has_seconds else self.stamps

    def ready(self) -> bool:
        """Enough steady steps to decide on, now."""
        return not self.decided and len(self.samples()) >= DECIDE_AT

    def has_median(self) -> bool:
        return len(self.samples()) >= MIN_STEPS

    def median(self, first: int | None = None) -> float | None:
        values = self.samples()
        values = values if first is None else values[:first]
        if len(values) < MIN_STEPS:
            return None
        if len(values) < BULK:
            return median(values)
        import numpy as np

        # numpy's median of the same doubles: the middle one, or the mean of the middle two
        return float(np.median(np.frombuffer(values, dtype=np.float64)))


def _fits(values: list) -> bool:
    """Integers whose differences an int64 holds."""
    return not values or (min(values) > -_SAFE and max(values) < _SAFE)


def _in_burst(last: tuple[int, int] | None, step: int, ts: int | None) -> bool:
    """This line came in one burst with `last`, the line of the step before it."""
    return last is not None and step == last[0] + 1 and same_burst(last[1], ts)


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
