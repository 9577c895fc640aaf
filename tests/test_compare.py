"""`steptail compare`: aligned steps, tolerance, refusal on different slice shapes, the plot;
against SQLite and the real PostgreSQL."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from findings_logs import LogBuilder, store_lines
from matplotlib import image

from steptail.cli import main


def ce(step: int) -> float:
    return 3.8 - step * 2e-3


def run(*args):
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return r.exit_code, r.output


@pytest.fixture
def url(store):
    return store.engine.url.render_as_string(hide_password=False)


def add(store, name, builder):
    store_lines(store, name, builder.lines)


def test_identical_runs_are_clean(store, url):
    add(store, "control", LogBuilder().start().steps(1, 50, ce=ce))
    add(store, "arm", LogBuilder().start().steps(1, 50, ce=ce))
    code, out = run("compare", "arm", "control", "--db", url, "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["first_divergent_step"] is None and data["max_abs_delta"] == 0.0
    assert data["steps_compared"] == 50 and len(data["steps"]) == 50 and data["process_count"] == 32


def test_shifted_arm_flagged_at_the_right_step(store, url, tmp_path):
    add(store, "control", LogBuilder().start().steps(1, 80, ce=ce))
    add(store, "arm", LogBuilder().start().steps(1, 80, ce=lambda s: ce(s) + (0.02 if s >= 37 else 0.0005)))
    code, out = run("compare", "arm", "control", "--db", url, "--json")
    assert code == 1
    data = json.loads(out)
    assert data["first_divergent_step"] == 37 and data["divergent_steps"] == 44
    assert data["max_abs_delta"] == pytest.approx(0.02, abs=1e-9)
    row = next(r for r in data["steps"] if r["step"] == 37)
    assert row["beyond"] and row["delta"] == pytest.approx(0.02)
    # a looser tolerance lets it through; --rel scales with |control|
    assert run("compare", "arm", "control", "--db", url, "--tolerance", "0.03")[0] == 0
    assert run("compare", "arm", "control", "--db", url, "--rel", "0.01")[0] == 0
    # text report and the plot
    png = tmp_path / "cmp.png"
    code, out = run("compare", "arm", "control", "--db", url, "--plot", str(png))
    assert code == 1 and "diverges at step 37" in out and "max |Δce| 0.020000" in out
    img = image.imread(png)
    assert img.shape[0] > 100 and img.shape[1] > 100


def test_latest_incarnation_value_per_step(store, url):
    add(store, "control", LogBuilder().start().steps(1, 40, ce=ce))
    # the arm's first attempt at 21-30 was bad; its restore re-ran them correctly
    arm = LogBuilder().start().steps(1, 30, ce=lambda s: ce(s) + (0.5 if s > 20 else 0))
    add(store, "arm", arm.start(restore=20).steps(21, 40, ce=ce))
    code, out = run("compare", "arm", "control", "--db", url, "--json")
    assert code == 0, out


def test_different_slice_shapes_refused(store, url):
    add(store, "control", LogBuilder().start(process_count=32).steps(1, 10, ce=ce))
    add(store, "arm", LogBuilder().start(process_count=16).steps(1, 10, ce=ce))
    code, out = run("compare", "arm", "control", "--db", url)
    assert code == 2
    assert "slice shapes differ" in out and "16" in out and "32" in out
    add(store, "unknown", LogBuilder().steps(1, 10, ce=ce))  # no JAX start-up line read
    code, out = run("compare", "unknown", "control", "--db", url)
    assert code == 2 and "unknown" in out and "process_count" in out


def test_bad_input(store, url, tmp_path):
    add(store, "control", LogBuilder().start().steps(1, 10, ce=ce))
    assert run("compare", "nope", "control", "--db", url)[0] == 2
    assert run("compare", "control", "control", "--db", url, "--tolerance", "-1")[0] == 2
    code, out = run("compare", "control", "control", "--db", url, "--plot", str(tmp_path / "no" / "x.png"))
    assert code == 2 and "does not exist" in out
