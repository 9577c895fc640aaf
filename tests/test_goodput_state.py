"""Goodput kept as state at commit (storage.goodput, docs/goodput.md): whatever the batches
(a line at a time, blocks, one batch; rows in any order, a `completed step` line after its
LOSS-PARTS row), the stored figures equal the full recomputation over the run's rows, on both
stores, for saved logs with restarts and replays, for a followed run, and after a reparse."""

from __future__ import annotations

import random

import pytest
from goodput_logs import EXPECTED, bursty_log, stored_and_full, timed_log

from steptail.runs import goodput as gp
from steptail.runs.model import Batch, RunModel
from steptail.storage.goodput import rebuild
from steptail.storage.sql import SqlSink

SAMPLES = ("clean-300", "resume-gap", "resume-mismatch", "resume-from-zero", "cp4-lb-nan")


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch):
    monkeypatch.setattr(gp, "BLOCK", 16)  # the test logs' few hundred steps cross many block edges


def logs(samples) -> dict[str, list[bytes]]:
    out = {"timed": timed_log().encode().splitlines(keepends=True),
           "bursty": bursty_log(7, steps=100).encode().splitlines(keepends=True)}  # bursts across block edges
    for name in SAMPLES:
        out[name] = (samples / f"{name}.log").read_bytes().splitlines(keepends=True)
    return out


def commit_every(store, run: str, lines: list[bytes], every: int) -> None:
    sink, model = SqlSink(store), RunModel(run)
    with store.engine.begin() as conn:
        sink.ensure_run(conn, run)
    for i, line in enumerate(lines, 1):
        model.feed(line)
        if i % every == 0 or i == len(lines):
            with store.engine.begin() as conn:
                sink.write(conn, run, model.take())


@pytest.mark.parametrize("every", [7, 150, 10**9])
def test_the_state_kept_at_commit_is_the_full_recomputation(store, samples, every):
    for name, lines in logs(samples).items():
        run = f"{name}-{every}"
        commit_every(store, run, lines, every)
        stored, full = stored_and_full(store, run)
        assert stored == full, name
        assert (stored["replayed_s"] > 0) == (name not in ("clean-300", "cp4-lb-nan", "bursty")), name
    stored, _ = stored_and_full(store, f"timed-{every}")
    for key, want in EXPECTED.items():
        assert stored[key] == pytest.approx(want, rel=0.01), key


def test_rows_in_any_order_give_the_same_state(store, samples):
    """The batch's rows shuffled into small batches (a step's `completed step` row apart from
    its LOSS-PARTS row, later incarnations before earlier ones, saves after the steps they
    precede): the same state as the full recomputation at random points and at the end."""
    rng = random.Random(36)
    for name in ("timed", "resume-gap", "resume-from-zero"):
        model = RunModel(name)
        for line in logs(samples)[name]:
            model.feed(line)
        whole = model.take()
        rows = [(t, r) for t in ("loss_parts", "pod_metrics", "checkpoints", "config") for r in getattr(whole, t)]
        rng.shuffle(rows)
        sink = SqlSink(store)
        with store.engine.begin() as conn:
            sink.ensure_run(conn, name)
            sink.write(conn, name, Batch(incarnations=whole.incarnations))
        checked = 0
        while rows:
            n = rng.randint(1, 40)
            part, rows = rows[:n], rows[n:]
            batch = Batch()
            for table, row in part:
                getattr(batch, table).append(row)
            with store.engine.begin() as conn:
                sink.write(conn, name, batch)
            if rng.random() < 0.1:
                stored, full = stored_and_full(store, name)
                assert stored == full, name
                checked += 1
        stored, full = stored_and_full(store, name)
        assert stored == full and checked, name


def test_rebuild_gives_the_state_commits_gave(store, samples):
    commit_every(store, "gap", logs(samples)["resume-gap"], 11)
    before = stored_and_full(store, "gap")[0]
    with store.engine.begin() as conn:
        rebuild(conn, "gap")
    assert stored_and_full(store, "gap")[0] == before


@pytest.mark.timeout(150)
def test_a_followed_run_and_its_reparse_keep_the_same_state(make_simcluster, tmp_path, db_url, monkeypatch):
    """Followed live (a JobSet restart: replayed steps), then reparsed from its raw log into a new
    run and in place: each time the stored figures are the full recomputation's, and the
    reparse's figures are the followed run's."""
    from test_follow_support import follow_sim, scenario

    from steptail.collector.offline.reparse import reparse
    from steptail.storage.db import open_store

    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")
    sim = make_simcluster(scenario({"action": "restart_jobset", "at_step": 130}))
    raw = tmp_path / "raw"
    follow_sim(sim, db_url, raw=str(raw))
    store = open_store(db_url)
    try:
        followed, full = stored_and_full(store, "r")
        assert followed == full
        assert len(followed["restarts"]) == 1 and followed["replayed_s"] > 0
        reparse(store, "r", raw, into="again")
        again, full = stored_and_full(store, "again")
        assert again == full and {**again, "run": "r"} == followed
        reparse(store, "r", raw, replace=True)
        assert stored_and_full(store, "r") == (followed, followed)
    finally:
        store.dispose()


def test_a_store_from_before_the_state_gets_it_from_its_rows(store, db_url, samples):
    """A store left at 0013 (rows, no goodput state, no container starts): opening it fills the
    state (0014) from the rows, the figures the commits would have kept."""
    import sqlalchemy as sa

    from steptail.storage.db import open_store

    commit_every(store, "gap", logs(samples)["resume-gap"], 50)
    want = stored_and_full(store, "gap")[0]
    with store.engine.begin() as conn:
        for table in ("run_goodput", "goodput_incs", "goodput_blocks"):
            conn.execute(sa.text(f"DROP TABLE {table}"))
        conn.execute(sa.text("ALTER TABLE incarnations DROP COLUMN container_started_ns"))  # 0015's
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '0013'"))
    store.dispose()
    again = open_store(db_url)
    try:
        assert stored_and_full(again, "gap") == (want, want)
    finally:
        again.dispose()
