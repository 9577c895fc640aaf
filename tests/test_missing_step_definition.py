"""Missing steps have one definition (steptail.runs.gaps): `check` (the gap detectors), the
export manifest and the API report exactly its ranges, and the dashboards' missing-steps alert
SQL counts exactly its steps, on the same data in SQLite and in PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from store_fixtures import PG_ADMIN, ingest_sample, samples_dir

from steptail.api import Steptail
from steptail.collector.offline.files import open_source
from steptail.collector.offline.ingest import ingest
from steptail.dashboards import queries as q
from steptail.dashboards.macros import Context, TimeRange, expand
from steptail.parsers import format_ns
from steptail.runs import gaps
from steptail.storage.db import open_store
from steptail.storage.export import export_run
from steptail.storage.findings import check_run
from steptail.storage.reads import step_gaps
from steptail.storage.scratch import scratch_database

SAMPLES = ("clean-300", "resume-gap", "resume-mismatch", "resume-from-zero", "cp4-lb-nan")
START = "max_utils.py:273] Attempting to initialize the jax distributed system..."
T0 = datetime(2026, 11, 30, 6, 0, tzinfo=UTC)  # after the samples (04:00-05:30)
WINDOW = TimeRange(datetime(2026, 11, 30, 3, 0, tzinfo=UTC), datetime(2026, 11, 30, 9, 0, tzinfo=UTC))


def steps(lo: int, hi: int) -> list[int]:
    return list(range(lo, hi + 1))


# run -> the log, as start-ups ("start"), restores (("restore", N)) and LOSS-PARTS steps;
# and the gaps the definition finds in it: (kind, incarnation, first_step, last_step).
CASES = {
    "inner": (["start", *steps(1, 10), *steps(14, 20), 25],
              [("gap", 1, 11, 13), ("gap", 1, 21, 24)]),
    "head-after-restore": (["start", *steps(1, 30), *steps(33, 50), "start", ("restore", 40),
                            *steps(45, 52), *steps(56, 60)],
                           [("gap", 1, 31, 32), ("head_gap", 2, 41, 44), ("gap", 2, 53, 55)]),
    "late-first-step": (["start", *steps(5, 12)], [("head_gap", 1, 1, 4)]),
    # start-up unread (a saved log that starts mid-way, following began late): its head is missing
    "mid-stream": ([*steps(100, 104), *steps(106, 110)], [("head_gap", 1, 1, 99), ("gap", 1, 105, 105)]),
    "restore-no-gap": (["start", *steps(1, 20), "start", ("restore", 10), *steps(11, 30)], []),
    # the restore line read, the start-up not: the head is the step after the checkpoint
    "mid-resume": ([("restore", 40), *steps(41, 50)], []),
    "restore-read-late": ([("restore", 40), *steps(45, 50)], [("head_gap", 1, 41, 44)]),
    # a restart whose start-up and restore lines were lost: steps go back, nothing known missing
    "restart-unread": (["start", *steps(1, 30), *steps(21, 40)], []),
    # a head unread (its saves unknown), then a restart with its restore line lost: from step 1
    "restart-after-unread-head": ([*steps(11, 30), *steps(21, 40)],
                                  [("head_gap", 1, 1, 10), ("head_gap", 2, 1, 20)]),
    # ... after a checkpoint saved at 20: the restart resumed from it, its 21-24 were not read
    "restart-unread-after-save": (["start", *steps(1, 20), ("save", 20), *steps(21, 30), *steps(25, 40)],
                                  [("head_gap", 2, 21, 24)]),
    # chaos seed 105: the config's checkpoint period says no save came before step 39, so the
    # restart started from scratch and its unread head (step 1) is missing
    "restart-unread-before-a-save": (["start", ("period", 41), *steps(1, 39), *steps(2, 10)],
                                     [("head_gap", 2, 1, 1)]),
    # ... past one period: it resumed from 20 at the least, its 21-23 were not read
    "restart-unread-past-a-period": (["start", ("period", 10), *steps(1, 25), *steps(24, 30)],
                                     [("head_gap", 2, 21, 23)]),
    "restart-unread-at-a-period": (["start", ("period", 10), *steps(1, 25), *steps(21, 30)], []),
    # a period that is no number is no evidence: as without one
    "restart-unread-odd-period": (["start", ("period", "4x"), *steps(1, 39), *steps(2, 10)], []),
    "restart-unread-zero-period": (["start", ("period", "000"), *steps(1, 39), *steps(2, 10)], []),
}


def write_log(path, events: list) -> None:
    t = int(T0.timestamp()) * 1_000_000_000
    lines = []
    for e in events:
        t += 10_000_000_000
        if e == "start":
            body = START
        elif isinstance(e, tuple) and e[0] == "save":
            body = f"checkpointing.py:401] Saved a checkpoint at step {e[1]}."
        elif isinstance(e, tuple) and e[0] == "period":
            body = f"pyconfig.py:584] Config param checkpoint_period: {e[1]}"
        elif isinstance(e, tuple):
            body = f"checkpointing.py:613] Restoring checkpoint from step {e[1]}."
        else:
            body = f"train_sft.py:301] LOSS-PARTS step={e} ce={3.0 - e / 1000:.6f}"
        lines.append(f"{format_ns(t)} I1130 06:00:00.000000 140233 {body}\n")
    path.write_text("".join(lines))


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def store(request, tmp_path_factory):
    """The sample runs and CASES, ingested once per kind of store."""
    folder = tmp_path_factory.mktemp("missing-steps")
    if request.param == "sqlite":
        yield _loaded(f"sqlite:///{folder / 'steptail.db'}", folder)
        return
    with scratch_database(PG_ADMIN, "steptail_test") as url:
        yield _loaded(url, folder)


def _loaded(url: str, folder):
    store = open_store(url)
    for name in SAMPLES:
        ingest_sample(store, samples_dir(), name, name)
    for run, (events, _) in CASES.items():
        write_log(folder / f"{run}.log", events)
        src = open_source(str(folder / f"{run}.log"))
        try:
            ingest(store, run, [src])
        finally:
            src.close()
    return store


def as_tuples(found: list[dict]) -> list[tuple]:
    return [(g["kind"], g["incarnation"], g["first_step"], g["last_step"]) for g in found]


@pytest.mark.parametrize("run", list(CASES))
def test_the_definition_finds_the_cases_gaps(store, run):
    assert as_tuples(step_gaps(store, run)) == CASES[run][1]


@pytest.mark.parametrize("run", [*SAMPLES, *CASES])
def test_check_reports_the_definitions_gaps(store, run):
    found = [(f.kind, f.incarnation, f.first_step, f.last_step) for f in check_run(store, run)
             if f.kind in (gaps.GAP, gaps.HEAD_GAP)]
    assert sorted(found, key=lambda g: (g[1], g[2])) == as_tuples(step_gaps(store, run))


@pytest.mark.parametrize("run", ["resume-gap", "head-after-restore", "late-first-step"])
def test_export_and_api_report_the_definitions_gaps(store, run, tmp_path):
    expected = step_gaps(store, run)
    assert expected  # not vacuous
    assert export_run(store, run, tmp_path / run)["gaps"]["steps"] == expected
    frame = Steptail(store).gaps(run)
    assert list(frame.itertuples(index=False, name=None)) == [
        (g["kind"], g["incarnation"], g["first_step"], g["last_step"], g["last_step"] - g["first_step"] + 1)
        for g in expected]


def test_dashboards_missing_steps_alert_counts_the_definition(store):
    sql = expand(q.ALERT_MISSING_STEPS, Context(WINDOW, {}))
    if store.is_sqlite:  # SQLite has no `::` cast; the count is the same without it
        assert sql.count("::float8") == 1
        sql = sql.replace("::float8", "")
    with store.engine.connect() as conn:
        alert = {run: missing for run, missing in conn.execute(sa.text(sql.replace(":", r"\:")))}
    python = {run: sum(g["last_step"] - g["first_step"] + 1 for g in step_gaps(store, run)) for run in alert}
    assert alert == python
    # every run with kubelet timestamps is active in the window; some miss steps, some do not
    assert set(alert) == set(SAMPLES) - {"cp4-lb-nan"} | set(CASES)
    assert python["head-after-restore"] == 9 and python["resume-gap"] == 4 and python["restore-no-gap"] == 0
    assert python["mid-stream"] == 100 and python["restore-read-late"] == 4 and python["mid-resume"] == 0


@pytest.mark.parametrize("saw_start, restored_from, first_step, before, expected", [
    (True, None, 1, None, None),
    (True, None, 3, None, (1, 2)),
    (True, 0, 3, None, (1, 2)),  # restored from step 0: the same as a fresh start
    (True, 50, 51, None, None),
    (True, 50, 60, None, (51, 59)),
    (True, 50, 40, None, None),  # before its checkpoint: a replay, nothing missing
    (True, None, 3, 80, (1, 2)),  # a fresh start: from step 1, whatever came before
    (False, 50, 51, None, None),  # mid-resume, its restore line read: nothing missing
    (False, 50, 55, 70, (51, 54)),  # the restore line says where the head is
    (False, None, 9, None, (1, 8)),  # following began mid-way: the head was never read
    (False, None, 1, None, None),
    (False, None, 90, 80, (81, 89)),  # after the highest step recorded before it
    (False, None, 60, 80, None),  # a restart from a checkpoint whose restore line was lost
    (False, None, 81, 80, None),
    (True, None, None, None, None),  # no step recorded yet
    (False, None, None, None, None),
])
def test_head_gap(saw_start, restored_from, first_step, before, expected):
    gap = gaps.at_head(3, saw_start, restored_from, first_step, before)
    assert (None if gap is None else (gap.first_step, gap.last_step)) == expected
    if gap is not None:
        assert gap.unread == (not saw_start and restored_from is None)


@pytest.mark.parametrize("saw_start,restored_from,first_step,before,saved,expected", [
    (False, None, 43, 51, 41, (42, 42)),  # chaos seed 105: restarted from 41, its 42 rotated away
    (False, None, 42, 51, 41, None),  # its first step read is the one after the checkpoint
    (False, None, 60, 51, 41, (42, 59)),
    (False, 30, 43, 51, 41, (31, 42)),  # a restore line read says more than a save
    (True, None, 5, 51, 41, (1, 4)),  # a start-up read: from step 1
])
def test_an_unread_head_starts_after_the_checkpoint_saved_before(saw_start, restored_from, first_step,
                                                                  before, saved, expected):
    gap = gaps.at_head(2, saw_start, restored_from, first_step, before, saved)
    assert (None if gap is None else (gap.first_step, gap.last_step)) == expected


@pytest.mark.parametrize("saves,unread_before,before,period,expected", [
    ([], False, 39, 41, 0),  # chaos seed 105: no save reached, a restart starts from step 1
    ([], False, 82, 41, 82),
    ([], False, 90, 41, 82),
    ([30], False, 90, 41, 30),  # a save printed says more than the period
    ([], True, 90, 41, 0),  # an unread head before: a save may be in it
    ([], False, 90, None, None),  # no period, no save: nothing known
    ([], False, None, 41, None),
])
def test_the_checkpoint_period_bounds_where_an_unread_restart_resumed(saves, unread_before, before, period,
                                                                       expected):
    assert gaps.resumed_after(saves, unread_before, before, period) == expected


@pytest.mark.parametrize("value,expected", [
    ("41", 41), (" 41 ", 41), ("041", 41), ("0", None), ("-41", None), ("+41", None), ("4x", None),
    ("٤١", None), ("1000000000", None), ("999999999", 999999999), (None, None)])
def test_a_checkpoint_period_is_read_as_the_alert_sql_reads_it(value, expected):
    assert gaps.checkpoint_period(value) == expected


def test_gaps_stay_within_an_incarnation():
    found = gaps.missing_steps([(1, 1), (1, 4), (2, 9), (2, 10), (2, 12)], [(2, True, 7, 9)])
    assert [(g.kind, g.incarnation, g.first_step, g.last_step, g.count) for g in found] == [
        ("gap", 1, 2, 3, 2), ("head_gap", 2, 8, 8, 1), ("gap", 2, 11, 11, 1)]


def test_an_unread_head_after_an_unread_head_starts_at_step_1():
    """Chaos seed 106: incarnation 1 read from step 13 (its save at 12 rotated away), the
    restart from 12 read from 25: 13-24 of incarnation 2 may be lost, not 18-24 only."""
    found = gaps.missing_steps([(1, s) for s in range(13, 18)] + [(2, 25)],
                               [(1, False, None, 13), (2, False, None, 25)])
    assert [(g.incarnation, g.first_step, g.last_step) for g in found] == [(1, 1, 12), (2, 1, 24)]


def test_an_unread_head_starts_after_the_earlier_incarnations():
    steps_ = [(1, 31), (1, 32), (2, 20), (2, 21), (3, 40)]
    heads = [(1, False, None, 31), (2, False, None, 20), (3, False, None, 40)]
    found = gaps.missing_steps(steps_, heads)
    assert [(g.incarnation, g.first_step, g.last_step, g.unread) for g in found] == [
        (1, 1, 30, True), (2, 1, 19, True), (3, 1, 39, True)]  # incarnation 1's head (saves?) unread
    # incarnation 1 saved a checkpoint at 31: 2 and 3 restarted from it at the latest
    found = gaps.missing_steps(steps_, heads, [(1, 31)])
    assert [(g.incarnation, g.first_step, g.last_step) for g in found] == [(1, 1, 30), (3, 32, 39)]
