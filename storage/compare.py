"""Arm vs control: CE of two runs aligned by step (each step's value from its latest
incarnation), refused when the runs do not share a slice shape (process count); their step
times (a `step_time_regression` of the arm against the control: docs/verdicts.md); and its
chart (storage/plots.py says what it marks)."""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa

from steptail.runs.findings import STEP_TIME_REGRESSION
from steptail.runs.step_time import config_diff, control_detail, regression_severity
from steptail.storage import plots
from steptail.storage.db import Store
from steptail.storage.goodput import timing_on


class CompareRefused(Exception):
    """The comparison cannot be made; the message says why (one line)."""


@dataclass
class Comparison:
    arm: str
    control: str
    tolerance: float
    rel: float
    process_count: int
    rows: list[dict] = field(default_factory=list)  # step, arm_ce, control_ce, delta, beyond
    only_arm: int = 0
    only_control: int = 0
    # every step of each run, not only the common ones: step -> (ce, ce_raw) as latest_ce
    arm_ce: dict[int, tuple[float | None, str]] = field(default_factory=dict, repr=False)
    control_ce: dict[int, tuple[float | None, str]] = field(default_factory=dict, repr=False)
    step_time: dict | None = None  # step_time_vs_control(): None when either has no median step time

    @property
    def beyond(self) -> list[dict]:
        return [r for r in self.rows if r["beyond"]]

    @property
    def first_divergent_step(self) -> int | None:
        b = self.beyond
        return b[0]["step"] if b else None

    @property
    def max_abs_delta(self) -> float | None:
        deltas = [abs(r["delta"]) for r in self.rows if r["delta"] is not None]
        return max(deltas) if deltas else None

    @property
    def max_delta_step(self) -> int | None:
        best = None
        for r in self.rows:
            if r["delta"] is not None and (best is None or abs(r["delta"]) > abs(best["delta"])):
                best = r
        return best["step"] if best else None

    def summary(self) -> dict:
        return {
            "arm": self.arm, "control": self.control, "process_count": self.process_count,
            "tolerance": self.tolerance, "rel": self.rel, "steps_compared": len(self.rows),
            "only_arm": self.only_arm, "only_control": self.only_control,
            "max_abs_delta": self.max_abs_delta, "max_delta_step": self.max_delta_step,
            "first_divergent_step": self.first_divergent_step, "divergent_steps": len(self.beyond),
            "step_time": self.step_time,
        }


def latest_ce(conn: sa.Connection, run: str) -> dict[int, tuple[float | None, str]]:
    """step -> (ce, ce_raw) of the latest incarnation that recorded the step."""
    out: dict[int, tuple[float | None, str]] = {}
    for step, ce, raw in conn.execute(
        sa.text("SELECT step, ce, ce_raw FROM loss_parts WHERE run = :run ORDER BY step, incarnation"),
        {"run": run},
    ):
        out[step] = (ce, raw)
    return out


def slice_shape(conn: sa.Connection, run: str) -> set[int | None]:
    rows = conn.execute(
        sa.text("SELECT DISTINCT process_count FROM incarnations WHERE run = :run"), {"run": run})
    return {r[0] for r in rows}


def _shape(run: str, shapes: set[int | None]) -> int:
    known = {s for s in shapes if s is not None}
    if not known:
        raise CompareRefused(
            f"slice shape of {run} unknown: its log has no 'process_count' (JAX start-up line), "
            "so the comparison cannot be shown to be like for like")
    if len(known) > 1:
        raise CompareRefused(f"{run} ran on several slice shapes (process counts {sorted(known)})")
    return known.pop()


def beyond(arm: float | None, control: float | None, tolerance: float, rel: float) -> bool:
    """|arm - control| > tolerance + rel x |control|; a non-finite CE on one side only is beyond."""
    if arm is None or control is None:
        return (arm is None) != (control is None)
    return abs(arm - control) > tolerance + rel * abs(control)


def compare_runs(store: Store, arm: str, control: str, tolerance: float = 1e-3, rel: float = 0.0) -> Comparison:
    with store.engine.connect() as conn:
        shape_arm = _shape(arm, slice_shape(conn, arm))
        shape_control = _shape(control, slice_shape(conn, control))
        if shape_arm != shape_control:
            raise CompareRefused(
                f"slice shapes differ: {arm} ran on {shape_arm} hosts (processes), {control} on "
                f"{shape_control}; CE is only comparable on the same shape")
        a, c = latest_ce(conn, arm), latest_ce(conn, control)
        step_time = step_time_vs_control(conn, arm, control)
    common = sorted(set(a) & set(c))
    if not common:
        raise CompareRefused(f"{arm} and {control} have no step in common")
    result = Comparison(arm, control, tolerance, rel, shape_arm,
                        only_arm=len(set(a) - set(c)), only_control=len(set(c) - set(a)),
                        arm_ce=a, control_ce=c, step_time=step_time)
    for step in common:
        (ace, _), (cce, _) = a[step], c[step]
        delta = ace - cce if ace is not None and cce is not None else None
        result.rows.append({
            "step": step, "arm_ce": ace, "control_ce": cce, "delta": delta,  # None: not finite
            "beyond": beyond(ace, cce, tolerance, rel),
        })
    return result


_CONFIG = sa.text("SELECT name, value FROM config WHERE run = :run AND incarnation ="
                  " (SELECT MAX(incarnation) FROM config WHERE run = :run AND incarnation <= :inc)")


def step_time_vs_control(conn: sa.Connection, arm: str, control: str) -> dict | None:
    """The arm's latest incarnation's median step time against the control's (both as kept at
    commit, storage.goodput; the caller has made sure they share a slice shape): at 1.5x or more
    a `step_time_regression` (warning; critical from 5x) naming the Config params that differ
    (each side's latest config lines up to that incarnation). None when either has no median."""
    sides = []
    for run in (arm, control):
        timed = [i for i in timing_on(conn, run).report()["incarnations"] if i["median_step_s"]]
        if not timed:
            return None
        inc = timed[-1]
        config = dict(conn.execute(_CONFIG, {"run": run, "inc": inc["incarnation"]}).fetchall())
        sides.append((inc["incarnation"], inc["median_step_s"], config))
    (inc, med, config), (c_inc, c_med, c_config) = sides
    ratio = med / c_med
    severity = regression_severity(med, c_med)
    diff = config_diff(c_config, config)
    return {
        "kind": STEP_TIME_REGRESSION if severity else None, "severity": severity, "incarnation": inc,
        "median_step_s": med, "control_incarnation": c_inc, "control_median_step_s": c_med, "ratio": ratio,
        "config_differs": diff, "detail": control_detail(arm, inc, med, control, c_med, diff) if severity else None,
    }


ARM_COLOR, CONTROL_COLOR = "C1", "C0"


def plot(result: Comparison, path: str, store: Store) -> None:
    """The chart of `figure` as a PNG; the runs' gaps and restores read from `store`."""
    with store.engine.connect() as conn:
        arm, control = plots.read_marks(conn, result.arm), plots.read_marks(conn, result.control)
    plots.save_png(figure(result, arm, control), path)


def figure(result: Comparison, arm: plots.Marks, control: plots.Marks):
    """Both CE curves, every step of each (past the shorter run's end too), with their missing
    steps, non-finite CE and restores marked; below, their difference at the common steps with
    the tolerance and the first step beyond it. The control is drawn wide and pale, the arm thin
    on top of it: where they coincide, both show."""
    fig = plots.new_figure(12.0, 6.5)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    both = [top, bottom]
    runs = (("control", result.control, result.control_ce, control, CONTROL_COLOR, "\\\\", "left"),
            ("arm", result.arm, result.arm_ce, arm, ARM_COLOR, "//", "right"))
    for order, (role, run, ce, marks, color, hatch, side) in enumerate(runs):
        xs, ys = plots.broken_line((step, value) for step, (value, _) in ce.items())
        top.plot(xs, ys, color=color, label=f"{role} {run}", **plots.curve_style(order, 2))
        steps = sorted(ce)
        plots.shade_missing(top, plots.uncovered(marks.gaps, steps), f"{role}: ", hatch)
        plots.mark_nonfinite(top, [(s, ce[s][1]) for s in steps if not plots.finite(ce[s][0])],
                             color, f"{role}: ")
        plots.mark_restores(both, marks.incarnations, f"{role}: ", side)
    ends = {role: max(ce) for role, _, ce, *_ in runs if ce}
    if len(ends) == 2 and ends["arm"] != ends["control"]:
        shorter = min(ends, key=ends.get)
        plots.mark_end(both, ends[shorter], f"{shorter} ends at step {ends[shorter]}")
    top.set_ylabel("ce")
    top.set_title(f"{result.arm} vs {result.control} ({result.process_count} processes)")
    xs, ys = plots.broken_line((r["step"], r["delta"]) for r in result.rows)
    bottom.plot(xs, ys, color="black", lw=1, label="\u0394ce")
    bottom.axhline(result.tolerance, color="grey", ls=":", lw=1)
    bottom.axhline(-result.tolerance, color="grey", ls=":", lw=1)
    bottom.set_ylabel("\u0394ce (arm - control)")
    bottom.set_xlabel("step")
    first = result.first_divergent_step
    if first is not None:
        for ax in both:
            ax.axvline(first, color="red", ls="--", lw=1, label=f"diverges at step {first}" if ax is top else None)
    for ax in both:
        ax.grid(True, alpha=0.3)
    plots.legend(top)
    return fig
