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
