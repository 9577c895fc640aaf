"""A run missing its head is never called clean (issue 19, defect 4): `follow` started after
the process-0 log rotated (also after a JobSet restart), and `ingest` of a saved log that starts
mid-way, record a head_gap finding that says what is known, count it in the missing-steps
metric, and say which rules could not be checked for want of the head (the step-1 CE gate, the
load-balance rule); `check` exits 1. A first line stamped before what it follows (a node clock
stepped back) still opens the stream gap, in two windows. A run mid-resume with its restore line read is not flagged,
and a collector restart neither repeats nor re-counts the finding. SQLite and PostgreSQL; the
real kubectl against the simulated cluster."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from click.testing import CliRunner
from test_follow_support import gaps, in_gap, read, recorded, rows, scenario

from steptail.cli import main
from steptail.collector.cluster.kubectl import KubeTarget
from steptail.collector.live.follower import FollowConfig
from steptail.collector.live.supervisor import Plan, Supervisor
from steptail.collector.notify.alerts import Alerter
from steptail.collector.notify.metrics import Metrics
from steptail.runs.findings import STALL
from steptail.storage.db import open_store
from steptail.storage.reads import list_findings

pytestmark = pytest.mark.timeout(180)
CP4_LB = {"steps": 160, "checkpoint_period": 50, "context_parallelism": 4, "load_balance": True}


@pytest.fixture(autouse=True)
def _account_env(monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")


def _sim(make_simcluster, *faults, trainer=None, **over):
    return make_simcluster(scenario(*faults, rate=25, **over, jobsets=[
        {"name": "olmo3-sft", "hosts": 1, "trainer": trainer or {"steps": 160, "checkpoint_period": 50}}]))


def _follow(sim, db: str, until_step: int | None = None, timeout: float = 60.0) -> tuple[Supervisor, Metrics]:
    """Follow with the metrics and alerts `follow` wires, until the run is done or, with
    `until_step`, stopped as a crash leaves it once that step is committed."""
    store = open_store(db)
    metrics = Metrics()
    target = KubeTarget(sim.scenario.namespace, sim.account, str(sim.kubeconfig_path))
    plan = Plan(target, {"olmo3-sft": "r"}, alerts=Alerter(metrics=metrics), metrics=metrics,
                config=FollowConfig(until_done=until_step is None))

    async def main_() -> Supervisor:
        sup = Supervisor(store, plan)
        task = asyncio.create_task(sup.run(install_signals=False))
        deadline = time.monotonic() + timeout
        while not task.done():
            assert time.monotonic() < deadline, [(s.run, s.state, s.last_step) for s in sup.status.values()]
            if until_step is not None and any(s >= until_step for _, s in recorded(db, "r")):
                sup.stop()
            await asyncio.wait([task], timeout=0.1)
        await task
        return sup

    try:
        return asyncio.run(main_()), metrics
    finally:
        store.dispose()


def _missing_metric(metrics: Metrics) -> float:
    return metrics.registry.get_sample_value("steptail_missing_steps_total", {"run": "r"}) or 0.0


def _findings(db: str) -> dict[tuple, tuple[str, str]]:
    """(kind, incarnation, first_step, last_step) -> (severity, detail), as stored. Stalls left
    out: a busy machine delays the simulator's steps by more than 3 of its 40 ms intervals."""
    return {(k, i, a, b): (sev, d) for _, k, i, a, b, d, sev, _ in read(db, list_findings, "r") if k != STALL}


def _check(db: str):
    return CliRunner().invoke(main, ["check", "r", "--db", db])


def _wait_rotated_and_gone(sim, step: int, old_pod: str | None = None) -> None:
    sim.wait_step(step, timeout=30)
    deadline = time.monotonic() + 10
    while old_pod is not None and old_pod in sim.pod_names() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert old_pod is None or old_pod not in sim.pod_names()


def test_follow_started_after_a_rotation_flags_the_head_and_the_rules_it_held(make_simcluster, db_url):
    """The issue's cp4 run with load balancing on: steps 1-40 and the config lines rotated away."""
    sim = _sim(make_simcluster, {"action": "rotate", "at_step": 40}, trainer=CP4_LB)
    _wait_rotated_and_gone(sim, 60)
    _, metrics = _follow(sim, db_url)

    assert sorted(recorded(db_url, "r")) == [(1, s) for s in range(41, 161)]
    (gap,) = gaps(db_url, "r")
    assert "rotated away before following began" in gap[3]
    found = _findings(db_url)
    assert set(found) == {("head_gap", 1, 1, 40), ("step1_ce_gate", 1, 1, 1), ("rule:load_balance", 1, 41, 41)}
    # the load-balance rule's input (the config lines) went with the head: not evaluable, info
    assert {k[0]: sev for k, (sev, _) in found.items()} == {
        "head_gap": "warning", "step1_ce_gate": "warning", "rule:load_balance": "info"}
    head = found[("head_gap", 1, 1, 40)][1]
    assert "read from step 41" in head and "without the trainer's start-up or a restore line" in head
    assert "rotated away before following began" in head  # the stream gap that explains it
    assert "step 1 was never read" in found[("step1_ce_gate", 1, 1, 1)][1]
    lb = found[("rule:load_balance", 1, 41, 41)][1]
    assert lb.startswith("not evaluable: the config lines of") and "context_parallel_load_balance" in lb
    assert _missing_metric(metrics) == 40

    result = _check(db_url)
    assert result.exit_code == 1, result.output
    assert "40 steps missing: steps 1–40 (incarnation 1, head)" in result.output
    assert set(_findings(db_url)) == set(found)  # check computes what follow stored


def test_follow_started_after_a_restart_whose_head_rotated_away(make_simcluster, db_url):
    """Restarted at step 60 (restored from 50), the new pod's start-up, restore line and steps
    51-75 rotated away, the old pod deleted: the first step read is 76, with nothing to say
    whether steps before it were lost or came before a restore."""
    sim = _sim(make_simcluster, {"action": "restart_jobset", "at_step": 60, "grace_seconds": 1},
               {"action": "rotate", "at_step": 75})
    sim.wait_step(20, timeout=30)
    old = sim.process0()  # before the restart
    _wait_rotated_and_gone(sim, 90, old)
    _, metrics = _follow(sim, db_url)

    served = sorted(t.step for t in sim.truth() if t.incarnation == 2 and t.retrievable)
    assert served == list(range(76, 161))
    assert sorted(recorded(db_url, "r")) == [(1, s) for s in served]
    found = _findings(db_url)
    assert {k for k in found if k[0] == "head_gap"} == {("head_gap", 1, 1, 75)}
    head = found[("head_gap", 1, 1, 75)][1]
    assert "read from step 76" in head and "restart from a checkpoint" in head and "cannot tell" in head
    assert ("step1_ce_gate", 1, 1, 1) in found  # cp unknown: its config line was never read
    assert _missing_metric(metrics) == 75
    assert _check(db_url).exit_code == 1


def test_a_restart_before_the_first_save_whose_head_rotated_away_misses_step_1(make_simcluster, db_url):
    """Chaos seed 105: incarnation 1 read from its start, then a restart before the first
    checkpoint (period 50) whose start-up and steps 1-3 rotated away before they were read:
    with no save there is nothing to resume from, so the head of incarnation 2 is step 1, not
    the step after incarnation 1's last (a restart from a checkpoint whose restore was lost)."""
    sim = make_simcluster(scenario(
        {"action": "restart_jobset", "at_step": 40, "grace_seconds": 1, "head_rotated": 3}, rate=10,
        jobsets=[{"name": "olmo3-sft", "hosts": 1, "trainer": {"steps": 80, "checkpoint_period": 50}}]))
    old = sim.process0()
    _follow(sim, db_url, until_step=20)  # stopped before the restart (at step 40, 2 s later)
    sim.wait_step(10, incarnation=2, timeout=30)
    _wait_rotated_and_gone(sim, 10, old)
    _follow(sim, db_url)

    first = {i: min(s for j, s in recorded(db_url, "r") if j == i) for i, _ in recorded(db_url, "r")}
    assert first[1] == 1 and first[2] == 4  # incarnation 2 read from step 4: its 1-3 rotated away
    truth = {t.step for t in sim.truth() if t.incarnation == 2}
    assert min(truth) == 1  # the trainer restarted from scratch: no checkpoint before step 40
    found = _findings(db_url)
    assert ("head_gap", 2, 1, 3) in found, sorted(found)
    assert "checkpoint_period 50" in found[("head_gap", 2, 1, 3)][1]
    assert _check(db_url).exit_code == 1


def test_follow_started_after_a_rotation_past_a_clock_stepped_back(make_simcluster, db_url):
    """The node clock stepped back an hour at step 30, the log rotated at step 40: the first
    step read is stamped before its container started. Each step lost lies in a stream gap (one
    window per side of the step), under the head finding."""
    sim = _sim(make_simcluster, {"action": "clock_step", "at_step": 30, "seconds": -3601},
               {"action": "rotate", "at_step": 40})
    _wait_rotated_and_gone(sim, 60)
    _follow(sim, db_url)

    assert sorted(recorded(db_url, "r")) == [(1, s) for s in range(41, 161)]
    g = gaps(db_url, "r")
    assert len(g) == 2 and all("the node clock stepped back" in reason for *_, reason in g), g
    lost = [t for t in sim.truth() if t.step <= 40]
    assert len(lost) == 40 and all(in_gap(t, g) for t in lost)
    assert ("head_gap", 1, 1, 40) in _findings(db_url)


@pytest.mark.parametrize("back", [-10, -3601])
def test_a_re_read_after_an_outage_a_clock_step_back_and_a_rotation(make_simcluster, db_url, back):
    """Not the head, the same blind spot: the stream broke, log reads failed six times, the
    node clock stepped back and the log rotated before the re-read. Its first line is new yet
    stamped before the last line read: each step lost lies in one of two stream gaps (either
    side of the step) and in a gap finding; every later step is recorded."""
    # the outage strikes once step 39 was served (a loaded machine's follower starting late lost
    # the head to the rotation at 43 instead); the rest of the schedule keeps its timing after it
    sim = _sim(make_simcluster, {"action": "fail_next", "at_step": 39, "code": 503, "n": 6, "path": None,
                                 "wait_for_reader": 30},
               {"action": "eof_streams", "at_step": 39, "wait_for_reader": 30},
               {"action": "clock_step", "at_step": 41, "seconds": back},
               {"action": "rotate", "at_step": 43})
    _follow(sim, db_url)

    got = set(recorded(db_url, "r"))
    lost = [t for t in sim.truth() if (t.incarnation, t.step) not in got]
    assert lost and all(t.step > 39 for t in lost) and max(t.step for t in lost) < 50
    assert len(got) == 160 - len(lost)
    g = gaps(db_url, "r")
    assert len(g) == 2 and all("the node clock stepped back" in reason for *_, reason in g), g
    assert all(in_gap(t, g) for t in lost)
    assert ("gap", 1, min(t.step for t in lost), max(t.step for t in lost)) in _findings(db_url)


def test_follow_started_mid_resume_with_its_restore_line_read_is_clean(make_simcluster, tmp_path):
    """The control: after the restart the new pod holds its start-up and `Restoring checkpoint
    from step 50`; the incarnation starts at 51 as it should, nothing is missing in it."""
    sim = _sim(make_simcluster, {"action": "restart_jobset", "at_step": 60, "grace_seconds": 1})
    sim.wait_step(20, timeout=30)
    old = sim.process0()  # before the restart
    _wait_rotated_and_gone(sim, 80, old)
    db = str(tmp_path / "s.db")
    _, metrics = _follow(sim, db)

    assert sorted(recorded(db, "r")) == [(1, s) for s in range(51, 161)]
    assert _findings(db) == {} and _missing_metric(metrics) == 0
    result = _check(db)
    assert "head_gap" not in result.output and "missing" not in result.output, result.output


def test_the_head_finding_is_not_repeated_by_a_collector_restart(make_simcluster, db_url):
    sim = _sim(make_simcluster, {"action": "rotate", "at_step": 30})
    _wait_rotated_and_gone(sim, 40)
    sup, metrics = _follow(sim, db_url, until_step=70)
    assert [f.kind for f in sup.detectors["r"].flagged if f.kind == "head_gap"] == ["head_gap"]
    assert _missing_metric(metrics) == 30

    sup, metrics = _follow(sim, db_url)  # resumed from the stored model
    assert sorted(recorded(db_url, "r")) == [(1, s) for s in range(31, 161)]
    assert not [f for f in sup.detectors["r"].flagged if f.kind == "head_gap"]
    assert _missing_metric(metrics) == 0  # counted once, by the collector that found it
    assert rows(db_url, "SELECT COUNT(*) FROM findings WHERE run = :r AND kind = 'head_gap'", "r") == [(1,)]


def _headless(src, dst, first_step: int) -> None:
    """A saved log from the LOSS-PARTS line of `first_step` on (what a late `kubectl logs > f` keeps)."""
    lines = src.read_text().splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if f"LOSS-PARTS step={first_step} " in ln)
    dst.write_text("".join(lines[at:]))


def test_ingest_of_a_log_without_its_head(samples, tmp_path, db_url):
    _headless(samples / "clean-300.log", tmp_path / "late.log", 31)
    cli = CliRunner()
    for _ in range(2):  # a re-ingest adds nothing, changes no finding
        res = cli.invoke(main, ["ingest", str(tmp_path / "late.log"), "--run", "r", "--db", db_url, "--json"])
        assert res.exit_code == 0, res.output
        found = _findings(db_url)
        # its config lines went with the head: cp unknown, so the rules that need it are unchecked
        assert set(found) == {("head_gap", 1, 1, 30), ("step1_ce_gate", 1, 1, 1), ("rule:load_balance", 1, 31, 31)}
    assert "read from step 31" in found[("head_gap", 1, 1, 30)][1]
    result = _check(db_url)
    assert result.exit_code == 1 and "30 steps missing: steps 1–30 (incarnation 1, head)" in result.output
    api = CliRunner().invoke(main, ["export", "r", "--db", db_url, "--out", str(tmp_path / "bundle")])
    assert api.exit_code == 0, api.output
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["gaps"]["steps"] == [{"incarnation": 1, "first_step": 1, "last_step": 30, "kind": "head_gap"}]


def test_ingest_of_the_cp4_load_balance_run_without_its_config_and_step_1(samples, tmp_path, db_url):
    _headless(samples / "cp4-lb-nan.log", tmp_path / "late.log", 41)
    res = CliRunner().invoke(main, ["ingest", str(tmp_path / "late.log"), "--run", "r", "--db", db_url])
    assert res.exit_code == 0, res.output
    result = _check(db_url)
    assert result.exit_code == 1
    found = _findings(db_url)
    assert found[("head_gap", 1, 1, 40)][0] == "warning"
    gate, lb = found[("step1_ce_gate", 1, 1, 1)], found[("rule:load_balance", 1, 41, 41)]
    assert (gate[0], lb[0]) == ("warning", "info")
    assert "could not run: step 1 was never read" in gate[1] and "ici_context_parallelism unknown" in gate[1]
    assert "not evaluable: the config lines of ici_context_parallelism and context_parallel_load_balance missing" in lb[1]
    assert "40 steps missing" in result.output and "not evaluable: the config lines" in result.output
