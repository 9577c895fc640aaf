"""The bulk paths of an ingest, on SQLite and PostgreSQL: SqlSink's writes (SQLite: multi-row
INSERTs of up to MULTI rows; PostgreSQL, from COPY_MIN rows: COPY straight into the table, and
once that meets a stored row COPY into a staging table, then INSERT … SELECT … ON CONFLICT DO
NOTHING) and the detectors' steady path (runs of ordinary
steps taken at once). Exactly once per (run, incarnation, step): a write or an ingest done
again adds nothing; a row the store refuses in a bulk batch is quarantined alone, the others
written; findings are those of the row-by-row path, on the sample logs and on cut-up rows."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
import sqlalchemy as sa

from steptail.collector.offline.files import open_source
from steptail.collector.offline.ingest import ingest
from steptail.parsers import format_ns
from steptail.runs.detect import DETECTORS, Settings
from steptail.runs.detect.missing_rbf import MissingRbf, Owed
from steptail.runs.detect.stall import Stall
from steptail.runs.detectors import FindingEngine
from steptail.runs.model import Batch
from steptail.simcluster.trainer import Trainer
from steptail.storage import sql as sql_module
from steptail.storage.findings import check_run
from steptail.storage.reads import iter_loss_parts, iter_required_rbf, list_findings
from steptail.storage.sql import SqlSink

T0 = 1_796_011_200 * 10**9
STEPS = 5000  # above MULTI and COPY_MIN: the chunked and the COPY paths both run
SAMPLES = ["clean-300", "resume-gap", "resume-mismatch", "cp4-lb-nan", "resume-from-zero"]


def batch_of(run: str, first: int, last: int, ce_offset: float = 0.0) -> Batch:
    b = Batch()
    for n in range(first, last + 1):
        ts = T0 + n * 10**10
        b.loss_parts.append((run, 1, n, ts, 2.0 + ce_offset + n / 1e4, f"{2.0 + ce_offset + n / 1e4:.6f}",
                             f'{{"total":{n}.5}}'))
        b.required_rbf.append((run, 1, n, ts + 1, 1.5, "[1.5,1.25]", "normal"))
        b.pod_metrics.append((run, 1, n, ts + 2, 9.8, 180.5, 3980.25, 1048576, 3.5, "{}"))
    return b


def table(store, name: str, run: str) -> list[tuple]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(
            sa.text(f"SELECT * FROM {name} WHERE run = :run ORDER BY incarnation, step"), {"run": run})]


def tables(store, run: str) -> dict[str, list[tuple]]:
    return {t: table(store, t, run) for t in ("loss_parts", "required_rbf", "pod_metrics")}


def test_a_bulk_write_done_again_writes_nothing(store):
    run, sink = "again", SqlSink(store)
    with store.engine.begin() as conn:
        sink.ensure_run(conn, run)
        assert sink.write(conn, run, batch_of(run, 1, STEPS)) == []
    first = tables(store, run)
    assert [len(v) for v in first.values()] == [STEPS] * 3
    assert sink._staged == set()  # PostgreSQL: new rows COPYed straight into their tables
    with store.engine.begin() as conn:
        assert sink.write(conn, run, batch_of(run, 1, STEPS)) == []
    assert tables(store, run) == first
    # the straight COPY met stored rows: undone, and the staged INSERT … ON CONFLICT took them
    assert sink._staged == (set() if store.is_sqlite else {"loss_parts", "required_rbf", "pod_metrics"})
    # Overlapping with other values: only the new steps go in, the stored ones stay as they were.
    with store.engine.begin() as conn:
        assert sink.write(conn, run, batch_of(run, STEPS // 2, STEPS + 1500, ce_offset=1.0)) == []
    after = tables(store, run)
    assert {t: rows[:STEPS] for t, rows in after.items()} == first
    assert [len(v) for v in after.values()] == [STEPS + 1500] * 3
    assert after["loss_parts"][-1][4] == pytest.approx(3.0 + (STEPS + 1500) / 1e4)


def test_a_refused_row_in_a_bulk_batch_is_quarantined_alone(store):
    run, sink = "refused", SqlSink(store)
    batch = batch_of(run, 1, STEPS)
    beyond_bigint = (run, 1, 10**20, T0, 1.0, "1.0", "{}")  # both stores refuse it
    too_long = (run, 1, STEPS + 7, T0, 1.0, "1" * 70, "{}")  # PostgreSQL refuses it (ce_raw is 64)
    nul = (run, 1, STEPS + 9, T0, 1.0, "1\x002", "{}")  # PostgreSQL refuses it (text holds no NUL)
    batch.loss_parts[1234:1234] = [beyond_bigint]
    batch.loss_parts[3000:3000] = [too_long]
    batch.loss_parts[4000:4000] = [nul]
    with store.engine.begin() as conn:
        sink.ensure_run(conn, run)
        refused = sink.write(conn, run, batch)
    expected = [beyond_bigint] if store.is_sqlite else [beyond_bigint, too_long, nul]
    assert [(t, r) for t, r, _ in refused] == [("loss_parts", r) for r in expected]
    assert all(why for _, _, why in refused)
    stored = table(store, "loss_parts", run)
    assert [r[2] for r in stored] == list(range(1, STEPS + 1)) + ([STEPS + 7, STEPS + 9] if store.is_sqlite else [])
    assert len(table(store, "required_rbf", run)) == len(table(store, "pod_metrics", run)) == STEPS
    with store.engine.connect() as conn:
        kept = conn.execute(sa.text("SELECT kind, reason FROM quarantine WHERE run = :r"), {"r": run}).all()
    assert len(kept) == len(expected)
    assert all(kind == "loss_parts" and reason.startswith("store refused: ") for kind, reason in kept)


def test_a_copy_batch_that_fails_for_the_store_is_not_taken_for_a_refusal(store, monkeypatch):
    """A COPY failing for a reason not in its rows (here: a column the table lacks) is the
    store's failure: raised, not split into quarantined rows."""
    if store.is_sqlite:
        pytest.skip("COPY is PostgreSQL's")
    run, sink = "broken", SqlSink(store)
    monkeypatch.setattr(sql_module, "COLUMNS", {**sql_module.COLUMNS, "loss_parts": ("run", "no_such_column")})
    with pytest.raises(sa.exc.DBAPIError), store.engine.begin() as conn:
        sink.ensure_run(conn, run)
        sink.write(conn, run, batch_of(run, 1, sql_module.COPY_MIN))
    assert sink.refused == []


def write_log(path, steps: int, restart_after: int) -> None:
    """A --timestamps log of the benchmark's shape: a start, steps, a preemption, a restore
    from the last checkpoint (its steps replayed), more steps."""
    trainer = Trainer(steps=10**9, seed=3, checkpoint_period=1000, step_seconds=10.0)
    clock, lines = trainer.start_time, []

    def emit(text: list[str]) -> None:
        nonlocal clock
        base = int(clock.timestamp() * 1e9)
        lines.extend(f"{format_ns(base + i * 1_731)} {line}\n" for i, line in enumerate(text))

    emit(trainer.startup_lines(at=clock))
    step, incarnation, restore = 0, 1, None
    while step < steps:
        clock += timedelta(seconds=10)
        step += 1
        emit(trainer.step_lines(step, incarnation, at=clock, record=False))
        if step == restart_after and restore is None:
            emit(trainer.preemption_lines())
            restore = trainer.last_checkpoint(step)
            step, incarnation = restore, incarnation + 1
            clock += timedelta(seconds=5)
            emit(trainer.startup_lines(restore_from=restore, at=clock))
    path.write_text("".join(lines))




def ingest_path(store, run: str, path):
    src = open_source(str(path))
    try:
        return ingest(store, run, [src])
    finally:
        src.close()


def test_an_ingest_done_again_writes_nothing_new(store, tmp_path):
    path = tmp_path / "big.log"
    write_log(path, 3500, restart_after=2300)
    first = ingest_path(store, "big", path)
    assert first.loss_parts == first.required_rbf == 3500 + 2300 - 2000 and first.incarnations == 2
    rows, findings = tables(store, "big"), list_findings(store, "big")
    again = ingest_path(store, "big", path)
    assert (again.loss_parts, again.required_rbf, again.pod_steps) == (0, 0, 0)
    assert tables(store, "big") == rows
    assert list_findings(store, "big") == findings


class RbfByRow(MissingRbf):
    def _steady(self, inc, rows) -> int:
        return 0


class RowByRow(FindingEngine):
    """The engine without its steady path: every row through _loss and MissingRbf.rbf."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, detectors=tuple(RbfByRow if d is MissingRbf else d for d in DETECTORS), **kwargs)

    def _steady_losses(self, inc, rows) -> int:
        return 0

    def detector(self, cls):
        return super().detector(RbfByRow if cls is MissingRbf else cls)


def test_findings_of_the_samples_are_those_row_by_row(store, samples, monkeypatch):
    taken = []
    steady = FindingEngine._steady_losses

    def counted(self, inc, rows):
        n = steady(self, inc, rows)
        taken.append(n)
        return n

    monkeypatch.setattr(FindingEngine, "_steady_losses", counted)
    for name in SAMPLES:
        ingest_path(store, name, samples / f"{name}.log")
    assert sum(taken) > 200  # the steady path did take rows
    monkeypatch.setattr("steptail.storage.findings.FindingEngine", RowByRow)
    for name in SAMPLES:
        run = f"{name}-rows"
        ingest_path(store, run, samples / f"{name}.log")
        assert [f[1:-1] for f in list_findings(store, name)] == [f[1:-1] for f in list_findings(store, run)], name
        assert list(iter_loss_parts(store, name)) == list(iter_loss_parts(store, run))
        assert list(iter_required_rbf(store, name)) == list(iter_required_rbf(store, run))
    monkeypatch.undo()
    for name in SAMPLES:  # `check` over the stored rows agrees with what ingest stored
        assert [(f.kind, f.incarnation, f.first_step, f.last_step, f.detail, f.severity)
                for f in check_run(store, name)] == [f[1:-1] for f in list_findings(store, name)]


def _rows(rng: random.Random, q: float) -> tuple[list[tuple], list[tuple], dict[int, tuple]]:
    """LOSS-PARTS and REQUIRED_RBF rows of a few incarnations with anomalies at rate q: gaps,
    slow steps, a clock going back, nan, a missing REQUIRED_RBF, replays after a restart."""
    loss, rbf, incs = [], [], {}
    step, ts = rng.choice([0, 1, 5]), T0
    for inc in range(1, rng.randint(2, 4)):
        incs[inc] = ("r", inc, ts, rng.random() < 0.5, None, None, None, 0, 1, None)
        for _ in range(rng.randint(50, 2500)):
            step += rng.randint(2, 30) if rng.random() < q else 1
            dt = rng.choice([9, 10, 10, 11]) * 10**9 + rng.randint(0, 10**6)
            dt *= rng.randint(3, 10) if rng.random() < q else 1
            ts += -dt if rng.random() < q / 3 else dt
            ce = rng.random() * 3
            raw = f"{ce:.6f}"
            if rng.random() < q:
                ce, raw = None, "nan"
            loss.append(("r", inc, step, None if rng.random() < q / 3 else ts, ce, raw, "{}"))
            if rng.random() >= q:
                rbf.append(("r", inc, step, ts, 1.0, "[]", "p"))
        step = rng.choice([0, max(0, step - rng.randint(0, 500)), step])
    return loss, rbf, incs


def _cut(rng: random.Random, loss, rbf, incs) -> list[Batch]:
    out, i, j, seen = [], 0, 0, set()
    while i < len(loss) or j < len(rbf):
        k = rng.choice([1, 5, 40, 200, 1000, 5000])
        b = Batch(loss_parts=loss[i : i + k], required_rbf=rbf[j : j + k + rng.choice([0, 0, -1, 1])])
        i, j = i + k, j + len(b.required_rbf)
        for row in b.loss_parts + b.required_rbf:
            if row[1] not in seen:
                seen.add(row[1])
                b.incarnations[row[1]] = incs[row[1]]
        out.append(b)
    return out


def _run(cls, batches: list[Batch], settings: Settings) -> tuple:
    calls = []

    def clock() -> int:  # counts: the steady path must read it as often as the rows do
        calls.append(1)
        return len(calls)

    engine = cls("r", settings, {1: 2.0}, clock=clock)
    outs = [[(f.key, f.last_step, f.detail, f.detected_ns) for f in engine.observe(b)] for b in batches]
    outs.append([(f.key, f.last_step, f.detail) for f in engine.finish()])
    owed = engine.detector(MissingRbf).owed
    state = {n: (i.last_step, i.last_ts, (o := owed.get(n, Owed())).last, list(o.pending), sorted(o.seen))
             for n, i in engine._incs.items()}
    return outs, sorted((k, vars(f)) for k, f in engine.findings.items()), state, len(calls), \
        engine.detector(Stall).median.value(), engine._max_step


@pytest.mark.parametrize("seed", range(40))
def test_the_steady_path_finds_what_row_by_row_finds(seed):
    rng = random.Random(seed)
    loss, rbf, incs = _rows(rng, rng.choice([0, 1e-4, 1e-3, 3e-3]))
    batches = _cut(rng, loss, rbf, incs)
    settings = Settings(stall_k=rng.choice([3.0, 1.2]), stall_min_intervals=rng.choice([5, 1, 100]))
    assert _run(FindingEngine, batches, settings) == _run(RowByRow, batches, settings)
