"""A handover must never fork a run (issue 19, defect 2), made to happen on purpose.

The race: replica A's commit of run r reaches the fence while replica B is taking r over
(B holds the fence lock exclusive, its new epoch not committed yet). A's fence statement
waits for the lock; under READ COMMITTED it used to read the epoch from the snapshot taken
when the statement began — A's own epoch — and A committed *after* B had loaded the run.
B's next commit then moved the cursor back behind A's last step without touching the
incarnation row, and whoever loaded the run next (a third handover) read a step again past
the cursor: a second, false incarnation repeating it ("step 9 in incarnation 1 and again in
incarnation 2"). Real PostgreSQL, real sinks, models and fence; the interleaving is forced
by holding B's take-over transaction open until A's commit waits on the lock."""

from __future__ import annotations

import asyncio
import threading

import pytest
import sqlalchemy as sa
from store_fixtures import PG_ADMIN, samples_dir

from steptail.collector.live.assemble import claim_and_load
from steptail.collector.live.detect import Detectors
from steptail.collector.live.sink import RunSink
from steptail.storage.db import open_store
from steptail.storage.replicas import NotOwner, fence, take_over
from steptail.storage.scratch import scratch_database
from steptail.storage.sql import SqlSink, load_model

RUN, JOBSET, NS, STREAM = "fork", "fork", "default", "0000aaaa-0000/jax-tpu/0"


@pytest.fixture
def pg_store():
    with scratch_database(PG_ADMIN, "steptail_fork") as url:
        store = open_store(url)
        yield store
        store.dispose()


def log_lines() -> list[bytes]:
    return (samples_dir() / "clean-300.log").read_bytes().splitlines(keepends=True)


def index_of(lines: list[bytes], needle: bytes) -> int:
    return next(i for i, ln in enumerate(lines) if needle in ln)


def waiting_on_a_lock(store) -> int:
    """Sessions of this database waiting for an advisory lock."""
    with store.engine.connect() as c:
        return c.execute(sa.text(
            "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())")).scalar()


def owner(store, replica: str):
    """A replica's model and sink of the run, as collector.live.assemble builds them."""
    model, epoch = claim_and_load(store, RUN, JOBSET, NS, False, replica)
    sink = RunSink(store, RUN, None, Detectors(RUN, store), fence=lambda conn: fence(conn, RUN, epoch))
    return model, sink


def feed(model, lines: list[bytes]) -> None:
    for ln in lines:
        model.feed(ln, stream=STREAM)


def test_a_fence_waiting_behind_a_take_over_reads_the_new_epoch(pg_store):
    with pg_store.engine.begin() as c:
        _, ours = take_over(c, RUN, "A")
    taking = pg_store.engine.connect()
    tx = taking.begin()
    take_over(taking, RUN, "B")  # the fence lock exclusive, epoch 2 not committed yet
    outcome: list = []

    def commit_as_a() -> None:
        try:
            with pg_store.engine.begin() as c:
                fence(c, RUN, ours)
                outcome.append("committed")
        except NotOwner as exc:
            outcome.append(exc)

    t = threading.Thread(target=commit_as_a)
    t.start()
    try:
        for _ in range(200):
            if waiting_on_a_lock(pg_store):
                break
            threading.Event().wait(0.02)
        assert waiting_on_a_lock(pg_store) == 1  # A's fence waits behind B's take-over
    finally:
        tx.commit()
        taking.close()
        t.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], NotOwner), outcome


async def test_an_old_owners_commit_during_a_take_over_never_forks_the_run(pg_store):
    lines = log_lines()
    lp8 = index_of(lines, b"LOSS-PARTS step=8 ")
    done8 = index_of(lines, b"completed step: 8,")
    lp12 = index_of(lines, b"LOSS-PARTS step=12 ")
    assert lp8 < done8 < lp12

    # A follows the run and commits through step 8's LOSS-PARTS line
    model_a, sink_a = await asyncio.to_thread(owner, pg_store, "A")
    feed(model_a, lines[: lp8 + 1])
    assert await sink_a.flush(model_a) > 0
    feed(model_a, lines[lp8 + 1: index_of(lines, b"LOSS-PARTS step=9 ") + 1])  # read, not committed yet

    # B takes the run over: its transaction holds the fence lock while A's commit arrives
    taking = pg_store.engine.connect()
    tx = taking.begin()
    _, epoch_b = take_over(taking, RUN, "B")
    a_commit = asyncio.create_task(sink_a.flush(model_a))
    for _ in range(200):
        if await asyncio.to_thread(waiting_on_a_lock, pg_store):
            break
        await asyncio.sleep(0.02)
    SqlSink(pg_store).ensure_run(taking, RUN, JOBSET, NS)
    model_b = load_model(taking, RUN)
    tx.commit()
    taking.close()
    await a_commit
    assert model_b.current.last_step == 8
    assert isinstance(sink_a.lost, NotOwner), "A committed after B had loaded the run"

    # B re-reads from its cursor and commits the line after it (a step metric, no LOSS-PARTS)
    sink_b = RunSink(pg_store, RUN, None, Detectors(RUN, pg_store), fence=lambda conn: fence(conn, RUN, epoch_b))
    feed(model_b, lines[lp8 - 3: done8 + 1])
    await sink_b.flush(model_b)

    # C takes over from B (B killed), re-reads the overlap and goes on to step 12
    model_c, sink_c = await asyncio.to_thread(owner, pg_store, "C")
    feed(model_c, lines[lp8 - 3: lp12 + 1])
    await sink_c.flush(model_c)
    with pg_store.engine.connect() as c:
        recorded = c.execute(sa.text("SELECT incarnation, step FROM loss_parts WHERE run = :r ORDER BY step"),
                             {"r": RUN}).all()
        incarnations = c.execute(sa.text("SELECT incarnation FROM incarnations WHERE run = :r"), {"r": RUN}).all()
    assert [tuple(r) for r in incarnations] == [(1,)], "a false incarnation: the run forked"
    assert [tuple(r) for r in recorded] == [(1, s) for s in range(1, 13)]
