"""`follow --parquet URL` into the lake against the simulated cluster with the real kubectl:
the table holds exactly what SQL holds (every key once, the same values), on a local table
and through the S3 emulator; two replicas write one table through a handover and a SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import sqlalchemy as sa
from object_store_support import unique_prefix
from store_fixtures import PG_ADMIN
from test_follow_support import (
    assert_exactly_once,
    collector_events,
    findings,
    follow_sim,
    scenario,
    stop_replicas,
)

from steptail.storage.db import open_store
from steptail.storage.lake import Lake
from steptail.storage.scratch import scratch_database

TABLE_KEYS = {"loss_parts": "incarnation, step, ce", "required_rbf": "incarnation, step, max"}


def lake_equals_sql(db: str, url: str, run: str, env: dict | None = None) -> int:
    """Assert the lake's rows of `run` are SQL's, key for key and value for value; the count."""
    store = open_store(db)
    try:
        lake = Lake(url, store.catalog_url(), env=env)
        for table, cols in TABLE_KEYS.items():
            with store.engine.connect() as conn:
                want = [tuple(r) for r in conn.execute(sa.text(
                    f"SELECT {cols} FROM {table} WHERE run = :r ORDER BY incarnation, step"), {"r": run})]
            data = lake.read(table, run)
            names = [c.strip() for c in cols.split(",")]
            got = sorted(zip(*(data[c].to_pylist() for c in names), strict=True))
            assert len(got) == len(set((g[0], g[1]) for g in got)), f"{table}: a key twice"
            assert got == want, (table, len(got), len(want))
        with store.engine.connect() as conn:
            kinds = sorted(k for (k,) in conn.execute(sa.text("SELECT kind FROM findings WHERE run = :r"), {"r": run}))
        assert sorted(lake.read("findings", run)["kind"].to_pylist()) == kinds
        return len(want)
    finally:
        store.dispose()


def test_follow_into_a_local_table_holds_what_sql_holds(make_simcluster, db_url, tmp_path):
    # the restart waits (up to 10 s) for a read to have served step 110: a loaded machine started
    # follow after the first pod was gone, and the test then judged a late start (CI, 2026-12-07)
    sim = make_simcluster(scenario({"action": "rotate", "at_step": 60},
                                   {"action": "restart_jobset", "at_step": 110, "wait_for_reader": 10}))
    url = f"file://{tmp_path / 'lake'}"
    follow_sim(sim, db_url, parquet=url)
    assert_exactly_once(sim, db_url, "r")
    assert lake_equals_sql(db_url, url, "r") > 0


def test_follow_into_s3_deletes_nothing(make_simcluster, moto_s3, tmp_path, monkeypatch):
    for name, value in moto_s3.env.items():  # the collector reads the SDK's variables, as in a pod
        monkeypatch.setenv(name, value)
    sim = make_simcluster(scenario({"action": "restart_jobset", "at_step": 90}))
    db = f"sqlite:///{tmp_path / 's.db'}"
    url = moto_s3.url(unique_prefix("follow"))
    before = moto_s3.deletes()
    follow_sim(sim, db, parquet=url)
    assert_exactly_once(sim, db, "r")
    assert lake_equals_sql(db, url, "r", env=moto_s3.env) > 0
    assert moto_s3.deletes() == before


JOBSETS, STEPS, RATE = 4, 300, 10


def start_replica(sim, db: str, url: str, i: int, logs: Path, env: dict) -> subprocess.Popen:
    argv = [sys.executable, "-c", "from steptail.cli import main; main()", "follow", "--all",
            "-n", sim.namespace, "--kubeconfig", str(sim.kubeconfig_path),
            "--account", f"replica-{i}@steptail-sim.iam.gserviceaccount.com", "--db", db, "--no-view",
            "--parquet", url, "--parquet-every", "2", "--log-format", "json"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(logs / f"replica-{i}.log", "wb"),
                            start_new_session=True, env={**os.environ, **env})


def writers(db: str, url: str, env: dict) -> set[str]:
    """The writers whose commits the loss_parts table holds."""
    store = open_store(db)
    try:
        table = Lake(url, store.catalog_url(), env=env).table("loss_parts", create=False)
        return set() if table is None else {
            w for s in table.snapshots() if (w := s.summary.additional_properties.get("steptail.writer"))}
    finally:
        store.dispose()


def wait_for_writers(db: str, url: str, env: dict, n: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while len(writers(db, url, env)) < n:
        assert time.monotonic() < deadline, f"fewer than {n} replicas committed in {timeout} s"
        time.sleep(0.5)


def test_two_replicas_write_one_table_through_a_handover_and_a_sigkill(make_simcluster, moto_s3, tmp_path):
    """On the S3 emulator with the catalog in the shared PostgreSQL: one replica SIGKILLed
    mid-run (its commits in flight), the other takes its runs over from the table's own record."""
    sim = make_simcluster({
        "namespace": "default", "rate": RATE, "grace_seconds": 3, "restart_pending_seconds": 0.3,
        "jobsets": [{"name": f"sft-{i}", "hosts": 1, "trainer": {"steps": STEPS, "checkpoint_period": 100}}
                    for i in range(JOBSETS)]})
    url = moto_s3.url(unique_prefix("replicas"))
    before = moto_s3.deletes()
    with scratch_database(PG_ADMIN, "steptail_lake") as db:
        procs = []
        try:
            for i in range(2):
                procs.append(start_replica(sim, db, url, i, tmp_path, moto_s3.env))
                time.sleep(1.5)
            wait_for_writers(db, url, moto_s3.env, 2)  # both hold runs, both have committed to the table
            os.killpg(procs[0].pid, signal.SIGKILL)
            procs[0].wait(10)
            store = open_store(db)
            deadline = time.time() + 90
            while time.time() < deadline:
                with store.engine.connect() as conn:
                    n = conn.execute(sa.text("SELECT COUNT(*) FROM loss_parts")).scalar()
                if n >= JOBSETS * STEPS:
                    break
                time.sleep(0.5)
            store.dispose()
        finally:
            stop_replicas(procs, wait=60)
        logs = {p.name: p.read_text()[-3000:] for p in tmp_path.glob("replica-*.log")}
        assert procs[1].returncode == 0, logs
        for i in range(JOBSETS):
            run = f"sft-{i}"
            assert_exactly_once(sim, db, run, run)
            assert lake_equals_sql(db, url, run, env=moto_s3.env) == STEPS, (run, logs)
    assert moto_s3.deletes() == before


def test_a_lake_that_fails_is_said_and_caught_up_once_it_works(make_simcluster, tmp_path):
    """The table cannot be written for a while (a file where its data folder goes: refused even
    to root): the run says so (a parquet_failure collector event), follows on, and once the table can be
    written again it is caught up from SQL, every key once."""
    lake_dir = tmp_path / "lake"
    url = f"file://{lake_dir}"
    db = f"sqlite:///{tmp_path / 's.db'}"
    sim = make_simcluster(scenario(rate=20))  # 160 steps in 8 s: writes every 2 s
    blocker = lake_dir / "steptail" / "loss_parts" / "data"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a folder")

    def unblock_once_said() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if "parquet_failure" in {e["kind"] for e in collector_events(db, "r")}:
                    break
            except Exception:  # noqa: BLE001, S110 - the store is not made yet
                pass
            time.sleep(0.2)
        blocker.unlink()

    unblock = threading.Thread(target=unblock_once_said)
    unblock.start()
    follow_sim(sim, db, parquet=url)
    unblock.join()
    assert lake_equals_sql(db, url, "r") > 0
    # the collector's fault (SQL had every row): a collector event, cleared; no finding of the run
    (event,) = [e for e in collector_events(db, "r") if e["kind"] == "parquet_failure"]
    assert event["run"] == "r" and event["cleared"] and not event["lost_steps"], event
    assert "parquet_failure" not in {k for k, _ in findings(db, "r")}


def test_the_writer_commits_every_run_at_once_and_compacts_a_run_as_it_goes(tmp_path, monkeypatch):
    """One commit per table per period for all runs (commits grow with time, not runs), and a
    run's files rewritten as one every COMPACT_AFTER appends: readers open few files."""
    import asyncio

    from steptail.collector.live import lake_feed
    from steptail.runs.model import Batch

    monkeypatch.setattr(lake_feed, "COMPACT_AFTER", 4)
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    lake = Lake(f"file://{tmp_path / 'lake'}", store.catalog_url())
    writer = lake_feed.LakeWriter(store, lake, every=30.0)

    async def periods(n: int) -> None:
        for p in range(n):
            for run in ("a", "b", "c"):
                writer.add(run, Batch(loss_parts=[(run, 1, p * 10 + s, s, 1.0, "1.0", "{}") for s in range(1, 11)]))
            await writer.write(now=True)

    asyncio.run(periods(6))
    assert lake.commits == 6 + 3  # one append per period for three runs, one compaction per run
    tbl = lake.table("loss_parts")
    from pyiceberg.expressions import EqualTo
    assert len(tbl.scan(row_filter=EqualTo("run", "a")).plan_files()) == 3  # 4 compacted + 2 since
    assert sorted(lake.read("loss_parts", "a")["step"].to_pylist()) == list(range(1, 61))
    assert writer.failed == {} and writer.behind == set()
    store.dispose()
