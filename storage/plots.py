"""The CE charts of `compare --plot` (storage/compare.py) and of `export`'s ce.png
(storage/export.py): what a bare line would hide is drawn on it.

- Missing steps: the line breaks there (never a straight segment across them) and a span
  shades exactly the missing steps (first - 0.5 to last + 0.5).
- A non-finite CE (stored as NULL; a NaN is treated alike): a marker at the step's x at the
  foot of the axes, labelled with the step.
- A restore: a dotted vertical line at the step an incarnation restored, "restore from step
  N" (it resumed at N + 1); an incarnation after the first that restored nothing: "restart at
  step N, nothing restored", at N - 1.
- The end of the shorter of two runs: a vertical line "control ends at step N"; the longer
  run's later steps are drawn past it.
- Curves that coincide both show: the first drawn wide and pale, the later ones thin, each
  with its own dash, on top.

matplotlib's object API only (Figure, never pyplot): no global state, safe in the threads of
the HTTP server. matplotlib is imported when a chart is made (~0.2 s), not with this module."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from steptail.storage.reads import missing_steps

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

NAN = float("nan")
GAP_COLOR = "red"
RESTORE_COLOR = "dimgrey"
LISTED = 4  # steps named in a label; beyond, a count
LABELLED = 6  # restore lines named in the legend; beyond, only their text on the chart


@dataclass
class Marks:
    """What a run's chart marks besides its CE: its missing steps (reads.missing_steps) and its
    incarnations (incarnation, first_step, restored_from)."""

    gaps: list[dict] = field(default_factory=list)
    incarnations: list[dict] = field(default_factory=list)


def read_marks(conn: sa.Connection, run: str) -> Marks:
    incarnations = [dict(r._mapping) for r in conn.execute(sa.text(
        "SELECT incarnation, first_step, restored_from FROM incarnations WHERE run = :run"
        " ORDER BY incarnation"), {"run": run})]
    return Marks(missing_steps(conn, run), incarnations)


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def broken_line(points: Iterable[tuple[int, float | None]]) -> tuple[list[int], list[float]]:
    """(steps, values) of a Line2D: a non-finite value as NaN, and a NaN point at the first
    missing step of every hole, so that the line breaks instead of joining across it."""
    xs: list[int] = []
    ys: list[float] = []
    for step, value in sorted(points, key=lambda p: p[0]):
        if xs and step > xs[-1] + 1:
            xs.append(xs[-1] + 1)
            ys.append(NAN)
        xs.append(step)
        ys.append(value if finite(value) else NAN)
    return xs, ys


def uncovered(gaps: list[dict], present: list[int]) -> list[tuple[int, int]]:
    """The parts of the gaps' step ranges that no step of `present` (sorted) fills: what is
    still missing once every incarnation's steps are merged (a replay can fill a gap)."""
    out = set()
    for g in gaps:
        start, hi = g["first_step"], g["last_step"]
        for step in present[bisect_left(present, start):bisect_right(present, hi)]:
            if step > start:
                out.add((start, step - 1))
            start = step + 1
        if start <= hi:
            out.add((start, hi))
    return sorted(out)


def curve_style(order: int, count: int) -> dict:
    """Line2D keywords of the order-th of `count` curves drawn on one axes: the first wide and
    pale, the later thin, each its own dash, on top: a curve that runs exactly over another
    never hides it. A curve alone is a plain line."""
    if count == 1:
        return {"lw": 1.3, "ls": "-", "zorder": 2}
    if order == 0:
        return {"lw": 3.2, "alpha": 0.45, "ls": "-", "zorder": 2}
    return {"lw": 1.2, "alpha": 0.95, "ls": ("-", "--", "-.", ":")[(order - 1) % 4], "zorder": 2 + order}


def _steps_text(steps: list[int]) -> str:
    shown = ", ".join(str(s) for s in steps[:LISTED])
    more = f" … ({len(steps)} steps)" if len(steps) > LISTED else ""
    return f"step{'s' if len(steps) > 1 else ''} {shown}{more}"


def _ranges_text(ranges: list[tuple[int, int]]) -> str:
    shown = ", ".join(str(a) if a == b else f"{a}\u2013{b}" for a, b in ranges[:LISTED])
    more = f" … ({len(ranges)} ranges)" if len(ranges) > LISTED else ""
    return f"{shown}{more}"


def shade_missing(ax: Axes, ranges: list[tuple[int, int]], who: str = "", hatch: str | None = None) -> None:
    """One span per range of missing steps, labelled once with the ranges."""
    for i, (lo, hi) in enumerate(ranges):
        ax.axvspan(lo - 0.5, hi + 0.5, color=GAP_COLOR, alpha=0.2, lw=0, hatch=hatch, zorder=1,
                   label=f"{who}missing steps {_ranges_text(ranges)}" if i == 0 else None)


def mark_nonfinite(ax: Axes, steps: list[tuple[int, str | None]], color: str, who: str = "") -> None:
    """A marker at the foot of the axes at each step whose CE is not finite; (step, token as
    logged, e.g. "nan")."""
    if not steps:
        return
    xs = [s for s, _ in steps]
    word = "/".join(sorted({raw for _, raw in steps if raw})) or "nan/inf"
    foot = ax.get_xaxis_transform()  # x in steps, y in axes fractions
    ax.plot(xs, [0.04] * len(xs), ls="none", marker="X", ms=9, color=color, mec="black", mew=0.6,
            transform=foot, clip_on=False, zorder=6, label=f"{who}ce {word} at {_steps_text(xs)}")
    for x in xs[:LISTED]:
        ax.annotate(f"{word} @ {x}", (x, 0.04), xycoords=foot, xytext=(6, 6), textcoords="offset points",
                    fontsize="small", color=color)


def restore_points(incarnations: list[dict]) -> list[tuple[float, str]]:
    """(x, label) of each incarnation that resumed: at the step it restored, or, when it
    restored nothing after an earlier incarnation, just before its first step."""
    out = []
    for i, inc in enumerate(incarnations):
        restored, first = inc.get("restored_from"), inc.get("first_step")
        if restored is not None:
            out.append((restored, f"restore from step {restored}"))
        elif i > 0 and first is not None:
            out.append((first - 1, f"restart at step {first}, nothing restored"))
    return out


def mark_restores(axes: list[Axes], incarnations: list[dict], who: str = "", side: str = "right") -> None:
    """A dotted vertical line (on every axes; labelled on the first) at each restore point, its
    text along the line on the given side ("left" of it, or "right": two runs, two sides)."""
    top = axes[0]
    for i, (x, label) in enumerate(restore_points(incarnations)):
        for ax in axes:
            ax.axvline(x, color=RESTORE_COLOR, ls=":", lw=1.4, zorder=4,
                       label=f"{who}{label}" if ax is top and i < LABELLED else None)
        top.text(x, 0.98, f" {who}{label}", transform=top.get_xaxis_transform(), rotation=90,
                 va="top", ha="right" if side == "left" else "left", fontsize="small", color=RESTORE_COLOR)


def mark_end(axes: list[Axes], step: int, label: str) -> None:
    """A vertical line where the shorter run ends (on every axes; labelled on the first)."""
    for ax in axes:
        ax.axvline(step, color="black", ls="--", lw=1.1, zorder=4, label=label if ax is axes[0] else None)
    axes[0].text(step, 0.02, f" {label}", transform=axes[0].get_xaxis_transform(), rotation=90,
                 va="bottom", ha="left", fontsize="small")


def new_figure(width: float = 11.0, height: float = 4.5) -> Figure:
    import matplotlib  # here, not at the top: ~0.2 s to import, needed only for a plot

    matplotlib.use("Agg")  # no display; also safe in threads of the HTTP server
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def legend(ax: Axes) -> None:
    """Beside the axes, not over the curves."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", borderaxespad=0)


def save_png(fig: Figure, path: str | Path) -> None:
    fig.savefig(path, format="png")
