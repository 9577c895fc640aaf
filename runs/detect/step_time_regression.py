"""step_time_regression: an incarnation's median step time >= 1.5x the previous incarnation's
(warning; critical from 5x), naming the Config params that differ (runs/step_time.py)."""

from __future__ import annotations

from operator import itemgetter

from steptail.runs.detect.base import Detector, IncView
from steptail.runs.findings import NO_STEP, STEP_TIME_REGRESSION
from steptail.runs.rows import CHECKPOINTS, LOSS_PARTS, POD_METRICS
from steptail.runs.step_time import (
    DECIDE_AT,
    IncTimes,
    config_diff,
    regression_detail,
    regression_severity,
)


class StepTimeRegression(Detector):
    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.times: dict[int, IncTimes] = {}  # per incarnation: its steady step times

    def rows(self, inc: IncView, rows: dict[str, list]) -> None:
        """Feed the incarnation's step times; decide once it has DECIDE_AT steady steps.
        `completed step` rows go before LOSS-PARTS rows: whether the incarnation logs `seconds`
        is known before its stamps could decide."""
        times = self.times.get(inc.number)
        if times is None:
            times = self.times[inc.number] = IncTimes()
        for row in rows["checkpoints"]:
            if row[CHECKPOINTS.KIND] == "save":
                times.saves.add(row[CHECKPOINTS.STEP])
        pods = rows["pod_metrics"]
        if pods:
            times.pods(*([row[i] for row in pods] for i in (POD_METRICS.STEP, POD_METRICS.SECONDS,
                                                            POD_METRICS.TS_NS)))
        if times.first_loss is None and rows["loss_parts"]:
            times.first_loss = rows["loss_parts"][0][LOSS_PARTS.STEP]
        if not times.has_seconds:
            for row in rows["loss_parts"]:
                times.loss(row[LOSS_PARTS.STEP], row[LOSS_PARTS.TS_NS])
        if times.ready():
            self._decide(inc.number, first=True)

    def finish(self) -> None:
        for n in sorted(self.times):  # an incarnation that never reached DECIDE_AT steady steps
            self.times[n].close()
            if not self.times[n].decided:
                self._decide(n)

    def _decide(self, n: int, first: bool = False) -> None:
        """Incarnation n's median step time against the latest earlier incarnation that has
        one; its first DECIDE_AT steady steps when `first`, else all."""
        times = self.times[n]
        med = times.median(DECIDE_AT if first else None)
        if med is None:
            return
        times.decided = True
        # the latest earlier incarnation with a median (counted, not computed: each median
        # sorts all its samples, and this ran once per incarnation for every earlier one)
        earlier = [(m, t) for m, t in self.times.items() if m < n and t.has_median()]
        if not earlier:
            return
        prev, prev_times = max(earlier, key=itemgetter(0))
        prev_med = prev_times.median()
        severity = regression_severity(med, prev_med)
        if severity is None:
            return
        incs = self.engine.incarnations()
        inc, before = incs.get(n), incs.get(prev)
        diff = config_diff(before.config if before else {}, inc.config if inc else {})
        step = times.first_loss if times.first_loss is not None else (times.first_pod or NO_STEP)
        self.engine.emit(STEP_TIME_REGRESSION, n, step, step, regression_detail(n, med, prev, prev_med, diff), severity)
