"""One line cannot fork a run (issue 19, defect 3). A LOSS-PARTS step going back with no
evidence of a restart (a start-up line, a restore line, a new stream) is held until the next
step decides: steps going on from it are a restart whose start-up lines were rotated away (a
new incarnation, rows in order); steps going on with the old sequence make it a lone line,
quarantined and flagged (a warning), never an incarnation nor a critical finding. By `ingest`
and on the live path (with re-reads and a collector restarted while the step is held), on
both stores."""

from __future__ import annotations

import pytest
from test_cursor_order import KEY, S, follow, log
from test_poison_lines import T0, findings, ingest_file, quarantined, rows, write

from steptail.parsers import format_ns
from steptail.runs.model import RunModel
from steptail.storage.findings import check_run
from steptail.storage.reads import iter_loss_parts

ODD = b"I1130 train_sft.py:301] LOSS-PARTS step=50 ce=9.000000 z_loss=1.2e-04 weights=1048576"
CLOCK = lambda n, k: T0 + n * S + k * 1000  # noqa: E731


def with_odd(stamp: bytes) -> list[bytes]:
    """100 steps, and after step 50's lines one LOSS-PARTS line repeating step 50 (another ce)."""
    lines = log(100, CLOCK)
    at = next(i for i, ln in enumerate(lines) if b"LOSS-PARTS step=51 " in ln)
    return lines[:at] + [stamp + ODD] + lines[at:]


def restarted() -> list[bytes]:
    """Steps 1-60, then the trainer restarted at step 41 with its start-up lines rotated away."""
    first = log(60, CLOCK)
    return first + log(100, lambda n, k: CLOCK(n, k) + 30 * S)[1 + 3 * 40:]  # 3 lines a step


def loss(store, run: str) -> list[tuple]:
    return [(inc, step, ce_raw) for inc, step, _, _, ce_raw, _ in iter_loss_parts(store, run)]


def table_steps(store, run: str, table: str) -> list[tuple]:
    return rows(store, f"SELECT incarnation, step FROM {table} WHERE run = :run ORDER BY 1, 2", run=run)


def check_lone(store, run: str, jumped: bool) -> None:
    got = loss(store, run)
    assert [(i, s) for i, s, _ in got] == [(1, n) for n in range(1, 101)]
    assert dict((s, c) for _, s, c in got)[50] == f"{2 + 1 / 50:.6f}"  # the first step 50 kept
    assert rows(store, "SELECT incarnation FROM incarnations WHERE run = :run", run=run) == [(1,)]
    for table in ("required_rbf", "pod_metrics"):
        assert table_steps(store, run, table) == [(1, n) for n in range(1, 101)]
    (inc, step, detail), = findings(store, run, "step_jump")
    assert (inc, step) == (1, 50) and "step 50 after step 50" in detail
    assert len(findings(store, run, "clock_jump")) == (1 if jumped else 0)
    (kind, step, reason, _), = quarantined(store, run)
    assert (kind, step) == ("loss_parts", 50) and reason.startswith("step_back:")
    kinds = {f.kind: f.severity for f in check_run(store, run)}
    assert "resume_mismatch" not in kinds and "critical" not in kinds.values()


@pytest.mark.parametrize("stamp", [b"2099-06-01T00:00:00.5Z ", b"2026-11-30T04:00:50.5Z "], ids=["2099", "in order"])
def test_one_line_repeating_a_step_forks_nothing(store, tmp_path, stamp):
    lines = with_odd(stamp)
    ingest_file(store, "i", write(tmp_path / "i.log", lines))
    check_lone(store, "i", stamp.startswith(b"2099"))
    at = lines.index(stamp + ODD)
    # re-reads and collector restarts right after the held line, and after its step's lines
    follow(store, "f", lines, rereads=(at + 1, at + 2, at + 3, at + 5))
    check_lone(store, "f", stamp.startswith(b"2099"))


def test_a_restart_with_its_start_up_rotated_away_is_recognized_from_the_steps(store, tmp_path):
    lines = restarted()
    at = next(i for i, ln in enumerate(lines) if b"LOSS-PARTS step=41 " in ln and i > 100)
    ingest_file(store, "i", write(tmp_path / "i.log", lines))
    follow(store, "f", lines, rereads=(at + 1, at + 2, at + 3, at + 6))
    want = [(1, n) for n in range(1, 61)] + [(2, n) for n in range(41, 101)]
    for run in ("i", "f"):
        assert [(i, s) for i, s, _ in loss(store, run)] == want
        for table in ("required_rbf", "pod_metrics"):  # the held step's lines in the new incarnation
            assert table_steps(store, run, table) == want
        assert not findings(store, run, "step_jump") and not quarantined(store, run)


def test_a_held_step_at_the_end_of_a_log_is_a_lone_line(store, tmp_path):
    lines = log(30, CLOCK) + [b"2026-11-30T04:00:30.5Z " + ODD.replace(b"step=50", b"step=12")]
    ingest_file(store, "e", write(tmp_path / "e.log", lines))
    assert [s for _, s, _ in loss(store, "e")] == list(range(1, 31))
    assert [(k, s) for k, s, _, _ in quarantined(store, "e")] == [("loss_parts", 12)]
    assert [(i, s) for i, s, _ in findings(store, "e", "step_jump")] == [(1, 12)]


def test_evidence_opens_the_incarnation_at_once():
    """A new stream (a new container or pod) or a restore line: the step going back is a restart."""
    model = RunModel("r")
    for line in log(10, CLOCK):
        model.feed(line, stream=KEY)
    for line in log(3, lambda n, k: CLOCK(n, k) + 20 * S)[1:]:
        model.feed(line, stream="uid2/jax/0")
    batch = model.take()
    assert [(r[1], r[2]) for r in batch.loss_parts][-3:] == [(2, 1), (2, 2), (2, 3)]
    model.feed(b"2026-11-30T04:01:00Z I1130 checkpointing.py:1] Restoring checkpoint from step 2.", stream="uid2/jax/0")
    model.feed(log(3, lambda n, k: CLOCK(n, k) + 60 * S)[7], stream="uid2/jax/0")  # step 3 again
    assert [(r[1], r[2]) for r in model.take().loss_parts] == [(3, 3)] and not model.batch.flags


AHEAD = {"loss_parts": b"I1130 train_sft.py:301] LOSS-PARTS step=1000 ce=9.000000",
         "required_rbf": b"I1130 train.py:1333] REQUIRED_RBF step=1000 max=1.0 per_layer=[1.0] program=normal",
         "pod_metrics": b"I1130 metric_logger.py:210] completed step: 1000, seconds: 1.0, total_weights: 1, loss: 1.0"}


@pytest.mark.parametrize("table", sorted(AHEAD))
def test_one_line_far_ahead_forks_nothing(store, tmp_path, table):
    """Step 1000 printed 1 ms after step 50's lines: no run steps 949 times in a moment.
    Before: a LOSS-PARTS line so opened a false incarnation at step 51 and a 949-step gap."""
    lines = log(100, CLOCK)
    at = next(i for i, ln in enumerate(lines) if b"LOSS-PARTS step=51 " in ln)
    lines = lines[:at] + [b"2026-11-30T04:00:50.001Z " + AHEAD[table]] + lines[at:]
    ingest_file(store, "i", write(tmp_path / "i.log", lines))
    follow(store, "f", lines, rereads=(at + 1, at + 2, at + 4))
    for run in ("i", "f"):
        assert [(i, s) for i, s, _ in loss(store, run)] == [(1, n) for n in range(1, 101)]
        for t in ("required_rbf", "pod_metrics"):
            assert table_steps(store, run, t) == [(1, n) for n in range(1, 101)]
        (inc, step, detail), = findings(store, run, "step_jump")
        assert (inc, step) == (1, 1000) and "sooner than the steps between could run" in detail
        assert [(k, s) for k, s, _, _ in quarantined(store, run)] == [(table, 1000)]
        kinds = {f.kind: f.severity for f in check_run(store, run)}
        assert "gap" not in kinds and "critical" not in kinds.values(), kinds


@pytest.mark.parametrize("jump", [2, 5])
def test_one_line_a_few_steps_ahead_forks_nothing(store, tmp_path, jump):
    """LOSS-PARTS step 50+jump printed half a step after step 50's lines: too few steps ahead to
    be too fast, yet sooner than the steps it skips could run. Held until the next step decides:
    step 51 goes on with the run below it, so it is a lone line. Before: it was recorded, step 51
    was then held as a step going back and step 52 made it a restart — a false incarnation 2."""
    lines = log(100, CLOCK)
    at = next(i for i, ln in enumerate(lines) if b"LOSS-PARTS step=51 " in ln)
    odd = format_ns(CLOCK(50, 0) + S // 2).encode() + b" " + ODD.replace(b"step=50", b"step=%d" % (50 + jump))
    lines = lines[:at] + [odd] + lines[at:]
    ingest_file(store, "i", write(tmp_path / "i.log", lines))
    follow(store, "f", lines, rereads=(at + 1, at + 2, at + 3, at + 5))
    for run in ("i", "f"):
        assert [(i, s) for i, s, _ in loss(store, run)] == [(1, n) for n in range(1, 101)]
        assert "9.000000" not in {ce for *_, ce in loss(store, run)}  # the run's own step 50+jump
        for t in ("required_rbf", "pod_metrics"):
            assert table_steps(store, run, t) == [(1, n) for n in range(1, 101)]
        assert [(i, s) for i, s, _ in findings(store, run, "step_jump")] == [(1, 50 + jump)]
        assert [(k, s) for k, s, _, _ in quarantined(store, run)] == [("loss_parts", 50 + jump)]
        kinds = {f.kind: f.severity for f in check_run(store, run)}
        assert "gap" not in kinds and "critical" not in kinds.values(), kinds


def test_a_step_ahead_that_the_next_goes_on_from_is_recorded_at_once_in_order(store, tmp_path):
    """The other side of holding a step ahead: steps 51-52 lost, step 53 half a step after 50
    (the run sped up), 54 going on from it: every step read recorded, a gap of 51-52, nothing
    flagged; a log ending on a held step records it (nothing says it is not the run's)."""
    lines = [ln for ln in log(100, CLOCK) if b"step=51 " not in ln and b"step=52 " not in ln
             and b"step: 51," not in ln and b"step: 52," not in ln]
    at = next(i for i, ln in enumerate(lines) if b"LOSS-PARTS step=53 " in ln)
    lines[at] = format_ns(CLOCK(50, 0) + S // 2).encode() + b" " + lines[at].split(b" ", 1)[1]
    ingest_file(store, "g", write(tmp_path / "g.log", lines))
    follow(store, "h", lines, rereads=(at + 1, at + 2, at + 3, at + 5))
    ending = log(30, CLOCK) + [format_ns(CLOCK(30, 0) + S // 2).encode() + b" " + ODD.replace(b"step=50", b"step=33")]
    ingest_file(store, "e", write(tmp_path / "e.log", ending))
    for run in ("g", "h"):
        assert [s for _, s, _ in loss(store, run)] == [*range(1, 51), *range(53, 101)]
        assert not findings(store, run, "step_jump") and not quarantined(store, run)
        assert [(f.kind, f.first_step, f.last_step) for f in check_run(store, run) if f.kind == "gap"] == [("gap", 51, 52)]
    assert [s for _, s, _ in loss(store, "e")] == [*range(1, 31), 33]
    assert not quarantined(store, "e")


# 1 s a step, then 1000x faster from step 31 (the simulator's rates span as much)
SPED_UP = lambda n, k: CLOCK(n, k) if n <= 30 else T0 + 30 * S + (n - 30) * S // 1000 + k * 1000  # noqa: E731


@pytest.mark.parametrize("clock", [CLOCK, SPED_UP], ids=["steady", "sped up 1000x"])
def test_steps_lost_to_a_rotation_are_a_gap_not_a_lone_line(store, tmp_path, clock):
    """The other side: steps 31-70 missing from the log, the rest stamped as they ran."""
    lines = [ln for ln in log(100, clock) if not any(b"step=%d " % n in ln or b"step: %d," % n in ln
                                                    for n in range(31, 71))]
    ingest_file(store, "g", write(tmp_path / "g.log", lines))
    assert [s for _, s, _ in loss(store, "g")] == [*range(1, 31), *range(71, 101)]
    assert not findings(store, "g", "step_jump") and not quarantined(store, "g")
    assert [(f.kind, f.first_step, f.last_step) for f in check_run(store, "g") if f.kind == "gap"] == [("gap", 31, 70)]


def test_an_incarnation_s_own_head_read_after_its_steps_opens_nothing():
    """The new pod's head rotated away unread (read from step 30), then its oldest lines served
    again: its start-up, its restore line and steps 21-29, stamped after the container started
    and before step 30. Before: the start-up line was taken for a restart, a false incarnation
    (chaos seed 66). A line stamped after the steps still opens one."""
    restart = lambda n, k: CLOCK(n, k) + 100 * S  # noqa: E731
    first, second = log(40, CLOCK), log(60, restart)
    with_restore = [second[0], format_ns(restart(20, 9)).encode() + b" I1130 Restoring checkpoint from step 20."]
    head = with_restore + second[1 + 3 * 20:1 + 3 * 29]  # start-up, restore, steps 21-29
    model = RunModel("r")
    model.pod = "pod-1"
    for line in first:
        model.feed(line, stream="uid1/jax/0")
    model.pod = "pod-2"
    model.ran_on("pod-2", container_started_ns=restart(0, 0) - S)
    for line in [*second[1 + 3 * 29:], *head]:  # steps 30-60, then the head served again
        model.feed(line, stream="uid2/jax/0")
    batch = model.take()
    loss_steps = sorted((r[1], r[2]) for r in batch.loss_parts)
    assert loss_steps == [(1, n) for n in range(1, 41)] + [(2, n) for n in range(21, 61)]
    assert sorted(batch.incarnations) == [1, 2] and model.current.restored_from == 20
    assert not [f for f in batch.flags if f[0] == "r"]  # nothing flagged
    # a start-up stamped after the steps read: a restart (evidence), a new incarnation
    model.feed(format_ns(restart(61, 0)).encode() + b" " + second[0].split(b" ", 1)[1], stream="uid2/jax/0")
    assert model.count == 3
