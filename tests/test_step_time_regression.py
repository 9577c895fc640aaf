"""step_time_regression (runs/step_time.py, docs/verdicts.md): an incarnation >= 1.5x slower
than the one before is a warning naming the Config params that differ, from 5x critical; a
clean run has none; the verdict does not depend on how rows are cut into batches."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from goodput_logs import bursty_log, timed_log

from steptail.collector.offline.files import open_source
from steptail.collector.offline.ingest import ingest
from steptail.runs.detectors import FindingEngine
from steptail.runs.findings import STEP_TIME_REGRESSION
from steptail.runs.model import RunModel
from steptail.simcluster.trainer import Trainer
from steptail.storage.findings import load_findings


def ingested(store, tmp_path, run: str, text: str) -> list:
    path = tmp_path / f"{run}.log"
    path.write_text(text)
    src = open_source(str(path))
    try:
        ingest(store, run, [src])
    finally:
        src.close()
    with store.engine.connect() as conn:
        return [f for f in load_findings(conn, run) if f.kind == STEP_TIME_REGRESSION]


def test_a_slower_incarnation_on_another_mesh_is_a_warning_naming_the_change(store, tmp_path):
    [f] = ingested(store, tmp_path, "slow", timed_log(fsdp3=4, slow=20.0))
    assert (f.severity, f.incarnation, f.first_step) == ("warning", 3, 151)
    assert "20.00 s, 2.0x incarnation 2's (10.00 s)" in f.detail
    assert "ici_fsdp_parallelism 8 -> 4" in f.detail


def test_from_five_times_it_is_critical(store, tmp_path):
    [f] = ingested(store, tmp_path, "crawl", timed_log(fsdp3=8, slow=60.0))
    assert f.severity == "critical" and "6.0x" in f.detail and "no Config param differs" in f.detail


def test_a_mesh_change_at_the_same_speed_is_no_finding(store, tmp_path):
    assert ingested(store, tmp_path, "same", timed_log(fsdp3=4, slow=10.0)) == []
    assert ingested(store, tmp_path, "bit-slower", timed_log(fsdp3=4, slow=14.0)) == []  # under 1.5x


def test_the_samples_and_a_restarted_clean_run_have_none(store, samples, tmp_path):
    for name in ("clean-300", "resume-gap", "resume-mismatch", "resume-from-zero", "cp4-lb-nan"):
        assert ingested(store, tmp_path, name, (samples / f"{name}.log").read_text()) == [], name
    t = Trainer(steps=200, step_seconds=12.0)  # the demo's clean runs: a restart from a checkpoint
    lines = t.run_lines(until=120)
    lines += t.startup_lines(restore_from=100, at=t.start_time + timedelta(seconds=12 * 130))
    for s in range(101, 201):
        lines += t.step_lines(s, 2, at=t.start_time + timedelta(seconds=12 * (s + 40)))
    assert ingested(store, tmp_path, "trainer", "\n".join(lines) + "\n") == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_verdict_does_not_depend_on_the_batches(seed):
    lines = timed_log(fsdp3=4, slow=20.0).encode().splitlines(keepends=True)

    def verdicts(cuts) -> list[tuple]:
        model, engine = RunModel("r"), FindingEngine("r", clock=lambda: 0)
        found = []
        for i, line in enumerate(lines):
            model.feed(line)
            if i in cuts:
                found += engine.observe(model.take())
        found += engine.observe(model.take()) + engine.finish()
        return [(f.incarnation, f.first_step, f.detail, f.severity) for f in found if f.kind == STEP_TIME_REGRESSION]

    rng = random.Random(seed)
    whole = verdicts(set())
    assert len(whole) == 1
    assert verdicts({i for i in range(len(lines)) if rng.random() < 0.05}) == whole
    assert verdicts(set(range(len(lines)))) == whole


def test_seconds_beyond_the_stamps_are_no_regression(store, tmp_path):
    """Incarnation 3 claims 60 s steps its stamps show 10 s apart: timed as goodput times them."""
    text = timed_log(fsdp3=4, slow=10.0)
    head, tail = text.split("Restoring checkpoint from step 150.", 1)
    claimed = head + "Restoring checkpoint from step 150." + tail.replace("seconds: 10.000", "seconds: 60.000")
    assert ingested(store, tmp_path, "claims", claimed) == []


@pytest.mark.parametrize("seconds", [True, False])
def test_two_stalls_in_the_first_steps_are_no_regression(store, tmp_path, seconds):
    """Steps 65 and 72 of incarnation 2 wait 60 s each: two of its first 20 intervals, not its
    median (a window of steps averaged together would have carried them into most windows)."""
    assert ingested(store, tmp_path, "stalls", bursty_log(1, seconds, stalls=(65, 72))) == []


def test_steps_of_a_few_milliseconds_are_not_compared():
    """Under 10 ms a step's stamps measure the runtime's pipe (read late, in bursts), not the
    trainer: CI's chaos seed 106 read a 33 ms trainer's catch-up burst as 4 ms steps."""
    from steptail.runs.step_time import regression_severity

    assert regression_severity(0.04, 0.004) is None
    assert regression_severity(0.06, 0.011) == "critical" and regression_severity(0.02, 0.011) == "warning"


@pytest.mark.parametrize("seconds", [True, False])
@pytest.mark.parametrize("burst", [2, 3, 5])
def test_steps_stamped_in_bursts_are_no_faster(store, tmp_path, burst, seconds):
    """An incarnation whose lines reached the kubelet a few steps at a time (near-zero intervals,
    then a long one) steps as fast as the next, stamped step by step: no regression. Read step by
    step, the first incarnation's median interval is ~0 s and the second looks 10^5x slower."""
    assert ingested(store, tmp_path, f"burst{burst}", bursty_log(burst, seconds)) == []


@pytest.mark.parametrize(("slow", "severity"), [(10.0, None), (20.0, "warning"), (60.0, "critical")])
def test_compared_with_a_same_shape_control(store, db_url, tmp_path, slow, severity):
    """`steptail compare ARM CONTROL`: the arm's latest median step time against the control's,
    a step_time_regression from 1.5x (critical from 5x) naming the Config params that differ."""
    from click.testing import CliRunner

    from steptail.cli import main
    from steptail.storage.compare import compare_runs

    ingested(store, tmp_path, "control", timed_log(fsdp3=8, slow=10.0))
    ingested(store, tmp_path, "arm", timed_log(fsdp3=4 if severity else 8, slow=slow))
    st = compare_runs(store, "arm", "control").step_time
    assert st["severity"] == severity and st["ratio"] == pytest.approx(slow / 10.0, rel=0.01)
    assert (st["incarnation"], st["control_incarnation"]) == (3, 3)
    if severity is None:
        assert st["kind"] is None and st["config_differs"] == [] and st["detail"] is None
        return
    assert st["kind"] == STEP_TIME_REGRESSION
    assert st["config_differs"] == ["ici_fsdp_parallelism 8 -> 4"]
    assert f"{slow / 10:.1f}x same-shape control control's (10.00 s)" in st["detail"]
    r = CliRunner().invoke(main, ["compare", "arm", "control", "--db", db_url], catch_exceptions=False)
    assert f"step_time_regression ({severity})" in r.output and "ici_fsdp_parallelism 8 -> 4" in r.output
