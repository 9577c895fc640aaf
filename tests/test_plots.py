"""The CE charts (storage/plots.py) of `compare --plot` and `export`'s ce.png, read from stores
of the sample logs (tests/samples): a gap (resume-gap, steps 60-63), a restore (resume-gap,
from step 150), a restart that restored nothing (resume-from-zero) and a NaN (cp4-lb-nan, step
77). Each Figure is checked before it is saved (its artists' data: spans, markers, lines), and
what is saved is a PNG. SQLite and the real PostgreSQL."""

from __future__ import annotations

import math

import numpy as np
import pytest
from click.testing import CliRunner
from findings_logs import LogBuilder, store_lines
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from PIL import Image
from store_fixtures import ingest_sample

import steptail.storage.plots as plots
from steptail.cli import main
from steptail.storage.compare import compare_runs, plot
from steptail.storage.export import export_run, write_ce_plot

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
GAP = (60, 63)  # resume-gap's lost steps
RESTORED = 150  # resume-gap's second incarnation restored step 150 (ran 151-400)
NAN_STEP = 77  # cp4-lb-nan's ce=nan


@pytest.fixture
def saved(monkeypatch):
    """Every Figure a chart saves, in order; each still written (a real PNG)."""
    figures = []
    save = plots.save_png

    def keep(fig, path):
        figures.append(fig)
        save(fig, path)

    monkeypatch.setattr(plots, "save_png", keep)
    return figures


@pytest.fixture
def samples_store(store, samples):
    for run, name in (("rg", "resume-gap"), ("nan", "cp4-lb-nan"), ("zero", "resume-from-zero")):
        ingest_sample(store, samples, run, name)
    return store


def url(store) -> str:
    return store.engine.url.render_as_string(hide_password=False)


def lines(ax) -> dict[str, Line2D]:
    return {line.get_label(): line for line in ax.get_lines()}


def line_with(ax, text: str) -> Line2D:
    found = [line for line in ax.get_lines() if text in line.get_label()]
    assert len(found) == 1, [line.get_label() for line in ax.get_lines()]
    return found[0]


def finite_steps(line: Line2D) -> list[int]:
    return [int(x) for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True) if math.isfinite(y)]


def joins_only_neighbours(line: Line2D) -> bool:
    """No segment of the line spans a missing step: two consecutive finite points are one step apart."""
    pts = list(zip(line.get_xdata(), line.get_ydata(), strict=True))
    return all(x2 - x1 == 1 for (x1, y1), (x2, y2) in zip(pts, pts[1:], strict=False)
               if math.isfinite(y1) and math.isfinite(y2))


def spans(ax) -> list[tuple[float, float]]:
    return sorted((p.get_x(), p.get_x() + p.get_width()) for p in ax.patches if isinstance(p, Rectangle))


def vline_at(ax, label: str) -> float:
    line = lines(ax)[label]
    xs = list(line.get_xdata())
    assert len(xs) == 2 and xs[0] == xs[1], xs
    return xs[0]


def assert_png(path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    with Image.open(path) as img:
        img.load()
        assert img.format == "PNG" and img.size[0] >= 600 and img.size[1] >= 300


def colour_pixels(fig, ax, rgb: tuple[int, int, int], x_range: tuple[float, float], tol: int = 30) -> int:
    """Pixels of about colour `rgb` inside the axes, between the steps x_range."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    image = np.asarray(canvas.buffer_rgba())[:, :, :3].astype(int)
    height = image.shape[0]
    box = ax.get_window_extent()
    (x0, _), (x1, _) = ax.transData.transform([(x_range[0], 0), (x_range[1], 0)])
    region = image[int(height - box.y1) + 2:int(height - box.y0) - 2, int(max(x0, box.x0)):int(min(x1, box.x1))]
    return int((np.abs(region - np.array(rgb)).max(axis=2) <= tol).sum())


C0, C1 = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)
PALE_C0 = tuple(round(0.55 * 255 + 0.45 * c) for c in C0)  # the first curve: alpha 0.45 over white


# -- compare --plot ---------------------------------------------------------------------------
def test_compare_plot_marks_gap_nan_restore_and_the_controls_end(samples_store, saved, tmp_path):
    """Arm resume-gap (400 steps, gap, restore) against control cp4-lb-nan (120 steps, NaN)."""
    png = tmp_path / "cmp.png"
    r = CliRunner().invoke(main, ["compare", "rg", "nan", "--db", url(samples_store), "--plot", str(png)])
    assert r.exit_code == 1, r.output  # they differ: another seed
    assert_png(png)
    (fig,) = saved
    top, bottom = fig.axes[:2]
    arm, control = lines(top)["arm rg"], lines(top)["control nan"]
    # every step of each run is drawn, the arm's past the control's end too
    assert finite_steps(arm) == [s for s in range(1, 401) if not GAP[0] <= s <= GAP[1]]
    assert finite_steps(control) == [s for s in range(1, 121) if s != NAN_STEP]
    assert NAN_STEP in control.get_xdata()  # a break in the line at the NaN step
    assert joins_only_neighbours(arm) and joins_only_neighbours(control)
    # the gap: one span over exactly the missing steps
    assert spans(top) == [(GAP[0] - 0.5, GAP[1] + 0.5)]
    assert any(p.get_label() == "arm: missing steps 60\u201363" for p in top.patches)
    # the NaN: a marker at its step
    nan = line_with(top, "control: ce nan at step 77")
    assert list(nan.get_xdata()) == [NAN_STEP] and nan.get_marker() == "X"
    # the restore, on both axes; the control's end
    assert vline_at(top, "arm: restore from step 150") == RESTORED
    assert RESTORED in {line.get_xdata()[0] for line in bottom.get_lines() if line.get_linestyle() == ":"}
    assert vline_at(top, "control ends at step 120") == 120
    # the difference below: at the common steps the control has a finite value
    delta = lines(bottom)["\u0394ce"]
    assert finite_steps(delta) == [s for s in range(1, 121) if s != NAN_STEP and not GAP[0] <= s <= GAP[1]]
    assert joins_only_neighbours(delta)


def test_coinciding_curves_both_show(samples_store, saved, tmp_path):
    result = compare_runs(samples_store, "rg", "rg")
    plot(result, str(tmp_path / "same.png"), samples_store)
    (fig,) = saved
    top = fig.axes[0]
    arm, control = lines(top)["arm rg"], lines(top)["control rg"]
    assert list(arm.get_xdata()) == list(control.get_xdata())
    # the arm thin on top, the control wide and pale below: both colours are on the chart
    assert arm.get_zorder() > control.get_zorder() and arm.get_linewidth() < control.get_linewidth()
    assert colour_pixels(fig, top, C1, (200, 390)) > 100  # the arm's orange
    assert colour_pixels(fig, top, PALE_C0, (200, 390)) > 100  # the control's pale blue around it
    # the restore of each, its text on its own side
    assert vline_at(top, "arm: restore from step 150") == vline_at(top, "control: restore from step 150") == 150


def test_shorter_arm_is_marked_and_a_replayed_gap_is_not_shaded(store, saved, tmp_path):
    """A gap of a first incarnation that its replay filled is no missing step of the compared
    curve; the arm that ends first is marked as such."""
    def ce(step: int) -> float:
        return 3.8 - step * 1e-3

    store_lines(store, "control", LogBuilder().start().steps(1, 60, ce=ce).lines)
    arm = LogBuilder().start().steps(1, 30, ce=ce, skip=range(21, 26))
    store_lines(store, "arm", arm.start(restore=20).steps(21, 40, ce=ce).lines)
    png = tmp_path / "c.png"
    r = CliRunner().invoke(main, ["compare", "arm", "control", "--db", url(store), "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert_png(png)
    top = saved[0].axes[0]
    assert spans(top) == []  # 21-25 of incarnation 1 were recorded again by incarnation 2
    assert finite_steps(lines(top)["arm arm"]) == list(range(1, 41))
    assert finite_steps(lines(top)["control control"]) == list(range(1, 61))
    assert vline_at(top, "arm ends at step 40") == 40
    assert vline_at(top, "arm: restore from step 20") == 20
    # export's chart draws by incarnation: there the first incarnation's 21-25 are missing
    write_ce_plot(store, "arm", tmp_path / "arm.png")
    ax = saved[1].axes[0]
    assert spans(ax) == [(20.5, 25.5)]
    assert finite_steps(lines(ax)["incarnation 1"]) == [s for s in range(1, 31) if not 21 <= s <= 25]
    assert joins_only_neighbours(lines(ax)["incarnation 1"])


# -- export's ce.png --------------------------------------------------------------------------
def test_export_plot_marks_gap_restore_and_replay(samples_store, saved, tmp_path):
    export_run(samples_store, "rg", tmp_path / "rg")
    assert_png(tmp_path / "rg" / "ce.png")
    (fig,) = saved
    ax = fig.axes[0]
    first, second = lines(ax)["incarnation 1"], lines(ax)["incarnation 2"]
    assert finite_steps(first) == [s for s in range(1, 181) if not GAP[0] <= s <= GAP[1]]
    assert finite_steps(second) == list(range(151, 401))
    assert joins_only_neighbours(first) and joins_only_neighbours(second)
    assert spans(ax) == [(GAP[0] - 0.5, GAP[1] + 0.5)]
    assert vline_at(ax, "restore from step 150") == RESTORED
    # the replay (151-180) runs exactly over the first recording: both show there
    assert colour_pixels(fig, ax, C1, (155, 178)) > 20
    assert colour_pixels(fig, ax, PALE_C0, (155, 178)) > 20


def test_export_plot_marks_the_nan_step(samples_store, saved, tmp_path):
    export_run(samples_store, "nan", tmp_path / "nan")
    assert_png(tmp_path / "nan" / "ce.png")
    ax = saved[0].axes[0]
    only = lines(ax)["incarnation 1"]
    assert finite_steps(only) == [s for s in range(1, 121) if s != NAN_STEP]
    assert NAN_STEP in only.get_xdata() and joins_only_neighbours(only)
    nan = line_with(ax, "ce nan at step 77")
    assert list(nan.get_xdata()) == [NAN_STEP]
    assert spans(ax) == []


def test_export_plot_marks_a_restart_that_restored_nothing(samples_store, saved, tmp_path):
    write_ce_plot(samples_store, "zero", tmp_path / "zero.png")
    assert_png(tmp_path / "zero.png")
    ax = saved[0].axes[0]
    assert vline_at(ax, "restart at step 1, nothing restored") == 0
    assert finite_steps(lines(ax)["incarnation 1"]) == list(range(1, 91))
    assert finite_steps(lines(ax)["incarnation 2"]) == list(range(1, 201))


# -- the pieces --------------------------------------------------------------------------------
def test_broken_line_and_uncovered():
    xs, ys = plots.broken_line([(5, 1.0), (1, 1.0), (2, None), (3, float("inf")), (4, 2.0)])
    assert xs == [1, 2, 3, 4, 5] and [math.isnan(y) for y in ys] == [False, True, True, False, False]
    xs, ys = plots.broken_line([(1, 1.0), (2, 1.0), (7, 1.0)])
    assert xs == [1, 2, 3, 7] and math.isnan(ys[2])  # a break at the first missing step
    gaps = [{"first_step": 10, "last_step": 20}, {"first_step": 30, "last_step": 30}]
    assert plots.uncovered(gaps, [1, 12, 13, 20, 30]) == [(10, 11), (14, 19)]
    assert plots.uncovered(gaps, []) == [(10, 20), (30, 30)]
