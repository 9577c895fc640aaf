"""The detectors one by one, on small logs built line by line and fed through the real run
model (the live path); the step-1 gate and its reference files through the CLI as well."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from findings_logs import SEC, T0, LogBuilder, feed_engine, keys, store_lines

from steptail.cli import main
from steptail.runs.detect import Settings
from steptail.runs.detectors import FindingEngine
from steptail.runs.findings import Finding
from steptail.runs.reference import ReferenceError, load_reference
from steptail.runs.stream_gap import StreamGap
from steptail.storage.findings import check_run, save_findings

CP4 = {"ici_context_parallelism": 4, "context_parallel_load_balance": False}


def ce1(step: int) -> float:
    return 3.8 - step * 1e-3


def only(engine, kind):
    found = [f for f in engine.findings.values() if f.kind == kind]
    assert len(found) == 1, engine.findings
    return found[0]


# -- step-1 CE gate ---------------------------------------------------------------------------
@pytest.mark.parametrize("offset,flagged", [(0.0009, False), (-0.0009, False), (0.0011, True), (-0.5, True)])
def test_gate_tolerance(offset, flagged):
    lines = LogBuilder().start(**CP4).steps(1, 10).lines
    engine, _ = feed_engine("g", lines, reference_ce={1: ce1(1) + offset})
    if flagged:
        f = only(engine, "step1_ce_gate")
        assert f.severity == "critical" and (f.first_step, f.last_step) == (1, 1)
        assert f"{-offset:+.6f}" in f.detail
    else:
        assert keys(engine.findings.values()) == set()


def test_gate_missing_reference_is_reported():
    engine, _ = feed_engine("g", LogBuilder().start(**CP4).steps(1, 10).lines)
    f = only(engine, "step1_ce_gate")
    assert "no HF reference" in f.detail and f.severity == "warning"


def test_gate_not_applied_without_cp_or_reference():
    lines = LogBuilder().start(ici_context_parallelism=1).steps(1, 10).lines
    assert feed_engine("g", lines)[0].findings == {}
    # an explicit reference is applied whatever the parallelism
    engine, _ = feed_engine("g", lines, reference_ce={1: 1.0})
    assert only(engine, "step1_ce_gate").severity == "critical"


def test_gate_never_silently_skipped_when_step_1_is_missing():
    lines = LogBuilder().start(**CP4, restore=50).steps(51, 60).lines
    engine, _ = feed_engine("g", lines, reference_ce={1: 3.0})
    assert "never recorded" in only(engine, "step1_ce_gate").detail


def test_gate_tolerance_setting():
    lines = LogBuilder().start(**CP4).steps(1, 5).lines
    engine, _ = feed_engine("g", lines, reference_ce={1: ce1(1) + 0.01}, settings=Settings(gate_tolerance=0.02))
    assert engine.findings == {}


def test_reference_files(tmp_path):
    assert load_reference("3.25") == {1: 3.25}
    (tmp_path / "a.json").write_text('{"1": 3.5, "2": 3.4}')
    assert load_reference(str(tmp_path / "a.json")) == {1: 3.5, 2: 3.4}
    (tmp_path / "b.json").write_text('[{"step": 1, "ce": 3.5}]')
    assert load_reference(str(tmp_path / "b.json")) == {1: 3.5}
    (tmp_path / "c.csv").write_text("step,ce,source\n1,3.5,hf\n2,3.4,hf\n")
    assert load_reference(str(tmp_path / "c.csv")) == {1: 3.5, 2: 3.4}
    (tmp_path / "d.csv").write_text("1,3.5\n")
    assert load_reference(str(tmp_path / "d.csv")) == {1: 3.5}
    for bad, text in (("e.json", "{oops"), ("f.csv", "1,abc\n"), ("g.json", '{"1": "nan"}'), ("h.csv", "")):
        (tmp_path / bad).write_text(text)
        with pytest.raises(ReferenceError):
            load_reference(str(tmp_path / bad))
    with pytest.raises(ReferenceError):
        load_reference(str(tmp_path / "absent.json"))


def _followed_now(db: str, run: str) -> None:
    """The run as `follow` leaves it while following: a cluster source and a fresh heartbeat."""
    from steptail.storage.db import open_store
    from steptail.storage.run_outcome import heartbeat

    store = open_store(db)
    try:
        with store.engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO run_sources (run, source, added_ns) VALUES (:r, 'kubernetes:team/g', 1)"),
                         {"r": run})
        heartbeat(store, [run])
    finally:
        store.dispose()


def test_gate_through_cli(tmp_path):
    db = str(tmp_path / "g.db")
    log = tmp_path / "g.log"
    log.write_bytes(b"".join(LogBuilder().start(**CP4).steps(1, 10).lines))
    runner = CliRunner()
    assert runner.invoke(main, ["ingest", str(log), "--run", "g", "--db", db]).exit_code == 0
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps({"1": ce1(1) + 0.0005}))
    r = runner.invoke(main, ["check", "g", "--db", db, "--json", "--reference-ce", str(ref)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["findings"] == []
    r = runner.invoke(main, ["check", "g", "--db", db, "--reference-ce", str(ce1(1) + 0.4),
                             "--workload", "jobset-g-abcde", "-n", "team"])
    assert r.exit_code == 1 and "step1_ce_gate" in r.output
    # ingested from files: no workload to stop (issue 32 item 5), and it says why
    assert "kubectl patch" not in r.output and "ingested from saved files: nothing to stop" in r.output
    _followed_now(db, "g")  # a collector follows it now: its workload is still admitted
    r = runner.invoke(main, ["check", "g", "--db", db, "--reference-ce", str(ce1(1) + 0.4),
                             "--workload", "jobset-g-abcde", "-n", "team"])
    assert r.exit_code == 1
    assert "step1_ce_gate" in r.output
    assert ("kubectl patch workloads.kueue.x-k8s.io jobset-g-abcde -n team --type=merge "
            "-p '{\"spec\":{\"active\":false}}'") in r.output
    r = runner.invoke(main, ["check", "g", "--db", db, "--json"])  # no reference given: the stored one
    assert r.exit_code == 1
    (f,) = json.loads(r.output)["findings"]
    assert "differs from the HF reference" in f["detail"] and f["severity"] == "critical"  # issue 32 item 2
    r = runner.invoke(main, ["check", "g", "--db", db, "--reference-ce", str(tmp_path / "nope.csv")])
    assert r.exit_code == 2 and "neither a number nor a readable file" in r.output
    r = runner.invoke(main, ["check", "absent", "--db", db])
    assert r.exit_code == 2
    # a directory of per-run references: g.json is g's
    refs = tmp_path / "refs"
    refs.mkdir()
    (refs / "g.json").write_text(json.dumps({"1": ce1(1) + 0.0005}))
    r = runner.invoke(main, ["check", "g", "--db", db, "--json", "--reference-ce", str(refs)])
    assert r.exit_code == 0 and json.loads(r.output)["findings"] == [], r.output
    (refs / "g.json").write_text("{oops")
    r = runner.invoke(main, ["check", "g", "--db", db, "--reference-ce", str(refs)])
    assert r.exit_code == 2 and "g.json" in r.output


def test_reference_directory_holds_one_file_per_run(tmp_path):
    from steptail.runs.reference import reference_for

    (tmp_path / "a.json").write_text('{"1": 3.5}')
    (tmp_path / "b.csv").write_text("step,ce\n1,3.25\n")
    ref = load_reference(str(tmp_path))
    assert ref == tmp_path
    assert reference_for(ref, "a") == {1: 3.5} and reference_for(ref, "b") == {1: 3.25}
    assert reference_for(ref, "c") is None  # the gate then reports the missing reference
    assert reference_for({1: 2.0}, "a") == {1: 2.0} and reference_for(None, "a") is None


# -- gaps -------------------------------------------------------------------------------------
def test_gap_and_head_gap():
    b = LogBuilder().start().steps(5, 20, skip={9, 10}).start(restore=15).steps(19, 25)
    engine, _ = feed_engine("h", b.lines)
    assert keys(engine.findings.values()) == {
        ("head_gap", 1, 1, 4), ("gap", 1, 9, 10), ("head_gap", 2, 16, 18),
    }
    head2 = engine.findings[("h", "head_gap", 2, 16)]
    assert "restore from step 15" in head2.detail and "is 19" in head2.detail


def test_a_head_never_read_is_a_head_gap_and_its_rules_unchecked():
    b = LogBuilder().steps(40, 50)  # no start-up line: following began mid-way, the head never read
    engine, _ = feed_engine("m", b.lines)
    assert keys(engine.findings.values()) == {
        ("head_gap", 1, 1, 39), ("step1_ce_gate", 1, 1, 1), ("rule:load_balance", 1, 40, 40)}
    # the rule whose input (the config lines) was never read is not evaluable: info, never a breach
    assert {(f.kind, f.severity) for f in engine.findings.values()} == {
        ("head_gap", "warning"), ("step1_ce_gate", "warning"), ("rule:load_balance", "info")}
    head = only(engine, "head_gap")
    assert "read from step 40" in head.detail and "start-up" in head.detail and "restore line" in head.detail
    assert "could not run: step 1 was never read" in only(engine, "step1_ce_gate").detail
    assert only(engine, "rule:load_balance").detail.startswith(
        "not evaluable: the config lines of ici_context_parallelism and context_parallel_load_balance missing")


def test_no_head_gap_mid_resume_with_the_restore_line_read():
    b = LogBuilder().add("I1130 checkpointing.py:613] Restoring checkpoint from step 40.").steps(41, 50)
    assert feed_engine("m", b.lines, every=3)[0].findings == {}


def test_no_head_gap_for_a_restart_whose_restore_line_was_lost():
    b = LogBuilder().start(ici_context_parallelism=1).steps(1, 30).steps(21, 35)  # steps go back
    engine, _ = feed_engine("m", b.lines)
    assert keys(engine.findings.values()) == set()


def test_a_later_unread_head_starts_after_the_earlier_incarnations():
    """Incarnation 2 opened on other evidence (a new pod) with its start-up and restore lines
    unread: what is missing is what lies above incarnation 1's steps. The rules were up to
    incarnation 1's start-up, which was read (this trainer prints no config: nothing to check)."""
    from steptail.runs.model import Batch

    def batch(n, saw_start, steps):
        b = Batch()
        b.incarnations[n] = ("l", n, None, saw_start, steps[0], steps[-1], None, None, None, None)
        b.loss_parts = [("l", n, s, T0 + s * SEC, 3.0, "3.0", "{}") for s in steps]
        return b

    engine = FindingEngine("l")
    engine.observe(batch(1, True, list(range(1, 21))))
    engine.observe(batch(2, False, list(range(30, 36))))
    assert keys(engine.findings.values()) == {("head_gap", 2, 21, 29)}
    assert "earlier incarnations reached step 20" in only(engine, "head_gap").detail


def test_an_unread_head_with_its_config_read_checks_what_it_can():
    # the config lines survived (cp1): neither rule needs the lost head
    b = LogBuilder().add("I1130 pyconfig.py:584] Config param ici_context_parallelism: 1")
    b.add("I1130 pyconfig.py:584] Config param context_parallel_load_balance: True").steps(31, 40)
    assert keys(feed_engine("m", b.lines)[0].findings.values()) == {("head_gap", 1, 1, 30)}


def test_load_balance_config_read_after_the_unread_head_is_still_critical():
    b = LogBuilder().steps(31, 35).add("I1130 pyconfig.py:584] Config param ici_context_parallelism: 4")
    b.add("I1130 pyconfig.py:584] Config param context_parallel_load_balance: True").steps(36, 40)
    engine, out = feed_engine("m", b.lines)
    lb = only(engine, "rule:load_balance")  # the info dropped: `check` stores only the violation
    assert lb.severity == "critical" and "runbook forbids" in lb.detail and lb.first_step == -1
    # live, both were raised; the violation has a key of its own, so it is alerted too
    raised = [(f.severity, f.first_step) for batch in out for f in batch if f.kind == "rule:load_balance"]
    assert raised == [("info", 31), ("critical", -1)]


def test_gap_names_the_stream_gap():
    b = LogBuilder().start().steps(1, 10)
    lost_from = b.t + SEC
    b.steps(11, 20, skip=set(range(11, 15)))
    engine = FindingEngine("s")
    from steptail.runs.model import RunModel

    model = RunModel("s")
    for line in b.lines:
        model.feed(line)
        if b"step=10 " in line:
            engine.observe(model.take())
            engine.observe_stream_gap(StreamGap("pod-0/trainer", lost_from, lost_from + 50 * SEC, "log rotation"))
    engine.observe(model.take())
    f = only(engine, "gap")
    assert (f.first_step, f.last_step) == (11, 14)
    assert "log rotation" in f.detail and "pod-0/trainer" in f.detail


# -- stall --------------------------------------------------------------------------------------
def test_stall_offline_from_timestamps():
    b = LogBuilder(step_seconds=10).start().steps(1, 20)
    b.step(21, "3.7", after_s=45)  # 4.5 x the median
    b.steps(22, 30, skip={25, 26})  # lost steps explain their time: not a stall
    engine, _ = feed_engine("st", b.lines)
    assert keys(engine.findings.values()) == {("stall", 1, 21, 21), ("gap", 1, 25, 26)}
    b2 = LogBuilder(step_seconds=10).start().steps(1, 20)
    b2.step(21, "3.7", after_s=25)  # 2.5 x: within k = 3
    assert feed_engine("st", b2.lines)[0].findings == {}
    engine, _ = feed_engine("st", b2.lines, settings=Settings(stall_k=2))
    assert only(engine, "stall").first_step == 21


def test_no_stall_from_a_burst_of_stamps():
    """Steps stamped in a burst (a trainer flushing its buffer, a log written at once) make the
    median ~0 s: the next ordinary step is then "k x" it. A stall needs a wait of its own."""
    b = LogBuilder(step_seconds=0.001).start().steps(1, 10)
    b.step(11, "3.7", after_s=0.02)  # 20 x the median, but 20 ms
    b.steps(12, 20)
    assert feed_engine("st", b.lines)[0].findings == {}
    b.step(21, "3.7", after_s=1.5)  # over k x the median and over the 1 s floor: a stall
    assert only(feed_engine("st", b.lines)[0], "stall").first_step == 21
    burst = LogBuilder(step_seconds=0.001).start().steps(1, 10).step(11, "3.7", after_s=0.02)
    engine, _ = feed_engine("st", burst.lines, settings=Settings(stall_min_seconds=0))
    assert only(engine, "stall").first_step == 11  # without the floor: the false stall


def test_stall_live_from_the_clock():
    clock = [0]
    engine = FindingEngine("live", clock=lambda: clock[0])
    from steptail.runs.model import RunModel

    model = RunModel("live")
    b = LogBuilder(step_seconds=10).start(steps=100).steps(1, 20)
    for line in b.lines:
        model.feed(line)
        clock[0] += SEC  # arrival times on the engine's clock
    engine.observe(model.take())
    last = clock[0]
    assert engine.tick(last + 29 * SEC) == []
    assert engine.tick(last + 40 * SEC, running=False) == []  # the stream is not read: not judged
    # read again from +41 (a re-open, a take-over): the wait starts there, not at the last step
    assert engine.tick(last + 41 * SEC) == []
    assert engine.tick(last + 70 * SEC) == []
    (f,) = engine.tick(last + 72 * SEC)
    assert (f.kind, f.first_step) == ("stall", 21) and f.detected_ns == last + 72 * SEC
    assert engine.tick(last + 90 * SEC) == []  # once per stall
    # the late step then arrives: same stall, not a second finding
    b.step(21, "3.5", after_s=80)
    for line in b.lines[-2:]:
        model.feed(line)
    assert engine.observe(model.take()) == []


def test_a_line_vouches_for_the_trainer_up_to_its_stamp_not_its_arrival():
    """Live, the stall clock counts quiet only up to what the follower vouches for. A line
    re-read late (a hung stream's backlog) arrives long after its stamp: that wait is the
    collector's, not the trainer's (CI: a recovered rotation hang flagged as a stall when the
    flush ran between a re-read's first line and its next step). A line stamped well past
    the last step, or a look that found nothing unread, does prove the trainer quiet."""
    from steptail.runs.model import RunModel

    def live() -> tuple[FindingEngine, int, int]:
        clock = [0]
        engine = FindingEngine("live", clock=lambda: clock[0])
        model = RunModel("live")
        for line in LogBuilder(step_seconds=10).start(steps=100).steps(1, 20).lines:
            model.feed(line)
            clock[0] += SEC
        engine.observe(model.take())
        inc = engine._incs[engine._current]
        return engine, clock[0], inc.last_ts

    engine, last, stamp = live()  # k = 3 x 10 s: a stall is over 30 s
    assert engine.tick(last + 60 * SEC, heard_stamp_ns=stamp + 1 * SEC) == []  # backlog, arrived at +60 s
    assert engine.tick(last + 60 * SEC, heard_ns=last + 5 * SEC, heard_stamp_ns=stamp + 1 * SEC) == []
    (f,) = engine.tick(last + 60 * SEC, heard_stamp_ns=stamp + 45 * SEC)  # printed on, 45 s without a step
    assert (f.kind, f.first_step) == ("stall", 21) and "no new step for 45 s" in f.detail
    engine, last, stamp = live()
    (f,) = engine.tick(last + 60 * SEC, heard_ns=last + 40 * SEC, heard_stamp_ns=stamp + 1 * SEC)  # a look
    assert "no new step for 40 s" in f.detail
    engine, last, stamp = live()  # the node clock stepped back: the line vouches for nothing past the step
    assert engine.tick(last + 60 * SEC, heard_stamp_ns=stamp - 3600 * SEC) == []


def test_no_stall_after_the_last_planned_step():
    engine = FindingEngine("done", clock=lambda: 0)
    from steptail.runs.model import RunModel

    model = RunModel("done")
    for line in LogBuilder().start(steps=20).steps(1, 20).lines:
        model.feed(line)
    engine.observe(model.take())
    assert engine.tick(10**6 * SEC) == []


# -- CE -------------------------------------------------------------------------------------------
def test_nonfinite_ranges():
    b = LogBuilder().start()
    for s in range(1, 11):
        b.step(s, {4: "nan", 5: "inf", 8: "-inf"}.get(s, "3.5"))
    engine, _ = feed_engine("n", b.lines)
    assert keys(engine.findings.values()) == {("nonfinite_ce", 1, 4, 5), ("nonfinite_ce", 1, 8, 8)}
    assert "inf, nan" in engine.findings[("n", "nonfinite_ce", 1, 4)].detail


def test_resume_mismatch_ranges_and_growth():
    b = LogBuilder().start().steps(1, 30).start(restore=20)
    b.steps(21, 40, ce=lambda s: ce1(s) + (0.01 if s in (21, 22, 23, 26) else 0))
    engine, outputs = feed_engine("r", b.lines, every=1)
    assert keys(engine.findings.values()) == {("resume_mismatch", 2, 21, 23), ("resume_mismatch", 2, 26, 26)}
    handed = [(f.first_step, f.last_step) for out in outputs for f in out]
    assert handed[:3] == [(21, 21), (21, 22), (21, 23)]  # opened at once, then grown


def test_resume_from_zero_and_not_after_a_crash_at_step_1():
    b = LogBuilder().start().steps(1, 30).start().steps(1, 10)
    assert keys(feed_engine("z", b.lines)[0].findings.values()) == {("resume_from_zero", 2, 1, 1)}
    b = LogBuilder().start().steps(1, 1).start().steps(1, 10)
    assert feed_engine("z", b.lines)[0].findings == {}


def test_load_balance_rule():
    lines = LogBuilder().start(ici_context_parallelism=8, context_parallel_load_balance="true").steps(1, 3).lines
    engine, _ = feed_engine("lb", lines, reference_ce={1: ce1(1)})
    f = only(engine, "rule:load_balance")
    assert f.severity == "critical" and f.first_step == -1
    assert f.detail == ("ici_context_parallelism=8 with context_parallel_load_balance=true: the runbook forbids load "
                        "balancing with context parallelism (it moved step-1 CE by +0.39 at cp4 and +1.98 at cp8); "
                        "set context_parallel_load_balance=False (seen in the config lines of incarnation 1)")
    lines = LogBuilder().start(ici_context_parallelism=1, context_parallel_load_balance="True").steps(1, 3).lines
    assert feed_engine("lb", lines)[0].findings == {}


# -- REQUIRED_RBF ---------------------------------------------------------------------------------
def test_missing_rbf_rules():
    b = LogBuilder().start().steps(1, 20, no_rbf={5, 6, 7, 12, 20}, skip={15, 16})
    engine, _ = feed_engine("rbf", b.lines)
    # 15-16 are a gap, not missing probes; 20 is the last step (its probe may still come)
    assert keys(engine.findings.values()) == {
        ("missing_rbf", 1, 5, 7), ("missing_rbf", 1, 12, 12), ("gap", 1, 15, 16),
    }
    b = LogBuilder().start().steps(1, 20, no_rbf={20}).start(restore=20).steps(21, 22)
    assert ("missing_rbf", 1, 20, 20) in keys(feed_engine("rbf", b.lines)[0].findings.values())
    # a run that never logs the probe owes none
    b = LogBuilder().start().steps(1, 20, no_rbf=set(range(1, 21)))
    assert feed_engine("rbf", b.lines)[0].findings == {}


# -- follower failures --------------------------------------------------------------------------
def test_failures_once_per_position():
    """Only data lost (an unread tail) is a finding of the run; the collector's own faults
    (auth, stream, Parquet failures) are collector events, which the engine refuses."""
    engine = FindingEngine("f")
    (a,) = engine.observe_failure("unread_tail", "pod p deleted before its log was read to the end", 5)
    assert a.severity == "warning" and a.first_step == -1 and "deleted before" in a.detail
    assert engine.observe_failure("unread_tail", "again", 6) == []
    for kind in ("auth_failure", "stream_failure", "parquet_failure", "gap"):
        with pytest.raises(ValueError):
            engine.observe_failure(kind, "getting credentials: exec: executable gke-gcloud-auth-plugin failed", 8)
    assert engine.findings.keys() == {a.key}


def test_offline_equals_live_on_a_busy_log(store):
    """Every detector at once: offline through the store (SQLite and PostgreSQL) and live."""
    b = (LogBuilder(step_seconds=10)
         .start(ici_context_parallelism=2, context_parallel_load_balance=True, steps=200)
         .steps(1, 60, skip={10, 11}, no_rbf={30, 31}))
    b.step(61, "nan", after_s=60)
    b.steps(62, 80).start(restore=50).steps(53, 90, ce=lambda s: ce1(s) + (0.001 if s < 60 else 0))
    b.start().steps(1, 5)
    live, _ = feed_engine("busy", b.lines, every=7)
    store_lines(store, "busy", b.lines)
    offline = check_run(store, "busy")
    assert keys(offline) == keys(live.findings.values())
    assert {k for k, *_ in keys(offline)} == {
        "gap", "missing_rbf", "stall", "nonfinite_ce", "rule:load_balance", "step1_ce_gate",
        "head_gap", "resume_mismatch", "resume_from_zero",
    }


def test_check_reads_stream_gaps_and_keeps_live_findings(store):
    b = LogBuilder().start().steps(1, 10)
    lost_from = b.t + SEC
    b.steps(11, 20, skip={11, 12})
    store_lines(store, "sg", b.lines)
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO stream_gaps (run, stream, start_ns, end_ns, reason, detected_ns)"
                    " VALUES ('sg', 'pod-a/trainer', :s, :e, 'rotated while silent', 0)"),
            {"s": lost_from, "e": lost_from + 30 * SEC},
        )
        # found live by `follow`: `check` cannot recompute these and must keep reporting them
        save_findings(conn, [Finding("auth_failure", "sg", 1, 20, 20, "getting credentials: exec", "critical", 1)])
    (gap,) = check_run(store, "sg")
    assert "rotated while silent" in gap.detail and (gap.first_step, gap.last_step) == (11, 12)
    url = store.engine.url.render_as_string(hide_password=False)
    r = CliRunner().invoke(main, ["check", "sg", "--db", url, "--json"])
    assert r.exit_code == 1
    assert {f["kind"] for f in json.loads(r.output)["findings"]} == {"gap", "auth_failure"}


def test_replay_of_a_non_finite_step():
    b = LogBuilder().start()
    for s in range(1, 11):
        b.step(s, "nan" if s in (5, 7) else f"{ce1(s):.6f}")
    b.start(restore=3)
    for s in range(4, 12):
        b.step(s, "nan" if s == 7 else f"{ce1(s):.6f}")  # 5 now finite, 7 nan both times
    engine, _ = feed_engine("nr", b.lines)
    mm = engine.findings[("nr", "resume_mismatch", 2, 5)]
    assert mm.last_step == 5 and "(" in mm.detail and "nan" in mm.detail
    assert ("resume_mismatch", 2, 7, 7) not in keys(engine.findings.values())
