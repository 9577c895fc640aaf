"""`loss_summary` (storage.summary) is exactly what `loss_parts` holds, per incarnation, after
any sequence of writes: overlapping and repeated batches, several incarnations in one batch,
rows without a timestamp, rows the store refuses, a reparse that rebuilds the run; on SQLite
and PostgreSQL. The alerts read it in place of the rows (tests/test_missing_step_definition.py
holds them to the definition)."""

from __future__ import annotations

import random

import sqlalchemy as sa
from store_fixtures import at_revision, ingest_sample, samples_dir

from steptail.runs.model import Batch
from steptail.storage.sql import SqlSink

AGGREGATE = ("SELECT run, incarnation, COUNT(*), MIN(step), MAX(step), MIN(ts_ns), MAX(ts_ns)"
             " FROM loss_parts GROUP BY run, incarnation ORDER BY run, incarnation")
SUMMARY = ("SELECT run, incarnation, steps, lo, hi, first_ts_ns, last_ts_ns FROM loss_summary"
           " ORDER BY run, incarnation")
BLOCKS = ("SELECT run, incarnation, step / 16, COUNT(*), MIN(step), MAX(step), MIN(ce), MAX(ce),"
          " MIN(CASE WHEN ce IS NULL THEN step END) FROM loss_parts GROUP BY run, incarnation, step / 16"
          " ORDER BY 1, 2, 3")
ROLLUP = ("SELECT run, incarnation, block, steps, s0, s1, ce_lo, ce_hi, nan_step FROM loss_rollup"
          " ORDER BY 1, 2, 3")


def _both(store) -> tuple[list, list]:
    with store.engine.connect() as conn:
        return ([tuple(r) for r in conn.execute(sa.text(AGGREGATE))],
                [tuple(r) for r in conn.execute(sa.text(SUMMARY))])


def _blocks(store) -> tuple[list, list]:
    with store.engine.connect() as conn:
        return ([tuple(r) for r in conn.execute(sa.text(BLOCKS))],
                [tuple(r) for r in conn.execute(sa.text(ROLLUP))])


def _row(run: str, inc: int, step: int, ts: int | None, ce_raw: str | None = None,
         nan: bool = False) -> tuple:
    ce = None if nan else 3.0 - step / 1e4
    return (run, inc, step, ts, ce, ce_raw or ("nan" if nan else f"{ce:.6f}"), "{}")


def test_the_summary_follows_random_overlapping_writes(store):
    rng = random.Random(22)
    sink = SqlSink(store)
    for n in range(60):
        run = rng.choice(["a", "b"])
        rows = []
        for _ in range(rng.randint(1, 40)):
            inc, step = rng.randint(1, 3), rng.randint(0, 300)
            ts = None if rng.random() < 0.1 else 10**18 + rng.randint(0, 10**12)
            rows.append(_row(run, inc, step, ts, nan=rng.random() < 0.05))
        rows = list({r[:3]: r for r in rows}.values())  # one row per key in a batch, as the model's
        with store.engine.begin() as conn:
            sink.ensure_run(conn, run)
            sink.write(conn, run, Batch(loss_parts=rows))
        aggregate, summary = _both(store)
        assert summary == aggregate, f"after write {n}"
        blocks, rollup = _blocks(store)
        assert rollup == blocks, f"after write {n}"


def test_a_repeated_batch_changes_nothing_and_a_refused_row_is_not_counted(store):
    sink = SqlSink(store)
    rows = [_row("r", 1, s, 10**18 + s) for s in range(1, 11)]
    for _ in range(2):
        with store.engine.begin() as conn:
            sink.ensure_run(conn, "r")
            sink.write(conn, "r", Batch(loss_parts=rows))
    assert _both(store)[1] == [("r", 1, 10, 1, 10, 10**18 + 1, 10**18 + 10)]
    # PostgreSQL refuses a ce_raw longer than its column (SQLite keeps it): either way the
    # summary holds what the table holds
    odd = [_row("r", 1, 11, 10**18 + 11, "9" * 100), _row("r", 1, 12, 10**18 + 12)]
    with store.engine.begin() as conn:
        refused = sink.write(conn, "r", Batch(loss_parts=odd))
    aggregate, summary = _both(store)
    assert summary == aggregate
    assert summary[0][2] == (11 if refused else 12)
    assert _blocks(store)[1] == _blocks(store)[0]


def test_the_summary_survives_a_rebuild_of_the_run(store, tmp_path):
    from steptail.storage.reparse import clear_rows

    ingest_sample(store, samples_dir(), "resume-gap", "resume-gap")
    aggregate, summary = _both(store)
    assert summary == aggregate and [r[1] for r in summary] == [1, 2]
    assert _blocks(store)[1] == _blocks(store)[0]
    with store.engine.begin() as conn:
        clear_rows(conn, "resume-gap")
    assert _both(store) == ([], []) and _blocks(store) == ([], [])


def test_a_store_of_0008_gets_its_summary_from_the_rows_it_holds(db_url):
    from steptail.storage.db import open_store

    with at_revision(db_url, "0008") as conn:
        conn.execute(sa.text("INSERT INTO runs (run, created_ns, updated_ns) VALUES ('old', 1, 1)"))
        for inc, step, ts in ((1, 1, 5), (1, 2, None), (1, 4, 9), (2, 3, 12)):
            conn.execute(sa.text("INSERT INTO loss_parts (run, incarnation, step, ts_ns, ce, ce_raw, parts)"
                                 " VALUES ('old', :i, :s, :t, 1.0, '1.0', '{}')"), {"i": inc, "s": step, "t": ts})
    store = open_store(db_url)
    try:
        assert _both(store)[1] == [("old", 1, 3, 1, 4, 5, 9), ("old", 2, 1, 3, 3, 12, 12)]
        assert _blocks(store)[1] == _blocks(store)[0] == [
            ("old", 1, 0, 3, 1, 4, 1.0, 1.0, None), ("old", 2, 0, 1, 3, 3, 1.0, 1.0, None)]
    finally:
        store.dispose()


def _summaries_from_rows(store) -> list[dict]:
    """`runs`' counts and last steps as defined by the rows (what run_summaries read before
    it read loss_summary): every LOSS-PARTS row counted, the last one by (incarnation, step)."""
    with store.engine.connect() as conn:
        out = []
        for run, in conn.execute(sa.text("SELECT run FROM runs ORDER BY run")):
            steps, max_step = conn.execute(sa.text("SELECT COUNT(*), MAX(step) FROM loss_parts WHERE run = :r"),
                                           {"r": run}).one()
            last = conn.execute(sa.text("SELECT step, ce, ts_ns FROM loss_parts WHERE run = :r"
                                        " ORDER BY incarnation DESC, step DESC LIMIT 1"), {"r": run}).first()
            out.append({"run": run, "steps": steps, "max_step": max_step, "last_step": last and last[0],
                        "last_ce": last and last[1], "last_ts_ns": last and last[2]})
    return out


def test_the_runs_listing_reads_the_summary_and_equals_the_rows(store):
    from steptail.storage.reads import run_summaries

    for name in ("resume-gap", "resume-mismatch", "cp4-lb-nan", "clean-300"):
        ingest_sample(store, samples_dir(), name, name)
    rng = random.Random(7)
    sink = SqlSink(store)
    with store.engine.begin() as conn:  # a run whose latest incarnation is not its highest step
        sink.ensure_run(conn, "z")
        sink.write(conn, "z", Batch(loss_parts=[_row("z", 1, s, None if s % 7 else 10**18 + s) for s in
                                                range(1, 200)] + [_row("z", 2, s, 10**18 + 500 + s, nan=s == 60)
                                                                  for s in range(50, 61)]))
        sink.ensure_run(conn, "empty")
    for _ in range(10):
        with store.engine.begin() as conn:
            sink.write(conn, "z", Batch(loss_parts=[_row("z", rng.randint(1, 3), rng.randint(0, 300), 10**18)]))
    keys = ("run", "steps", "max_step", "last_step", "last_ce", "last_ts_ns")
    got = [{k: r[k] for k in keys} for r in run_summaries(store)]
    assert got == _summaries_from_rows(store)
    assert [r["run"] for r in got] == ["clean-300", "cp4-lb-nan", "empty", "resume-gap", "resume-mismatch", "z"]
