"""The lake on object storage, against real emulators started here (moto's S3 server and
fake-gcs-server, both on 127.0.0.1, explicit endpoints and credentials): exactly once across
racing writers and a writer killed mid-commit, readers agreeing with SQL row for row, and not
one DELETE request on the bucket, whatever happened."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from lake_support import keys, killed_mid_commit, older_table_gains_a_column, race, steps
from object_store_support import unique_prefix
from store_fixtures import PG_ADMIN

from steptail.runs.model import Batch
from steptail.storage.catchup import catch_up_lake
from steptail.storage.db import open_store
from steptail.storage.lake import Lake
from steptail.storage.object_store import list_objects
from steptail.storage.scratch import scratch_database
from steptail.storage.sql import SqlSink


@pytest.fixture(params=["s3", "gs"])
def bucket(request):
    """(emulator, a fresh table location on it)."""
    emulator = request.getfixturevalue("moto_s3" if request.param == "s3" else "fake_gcs")
    return emulator, emulator.url(unique_prefix("lake"))


@pytest.fixture(params=[("s3", "postgresql"), ("gs", "sqlite")], ids=["s3-postgresql", "gs-sqlite"])
def bucket_and_store(request, tmp_path):
    """For the slow race: each emulator once, with one catalog each (both catalogs covered)."""
    where, kind = request.param
    emulator = request.getfixturevalue("moto_s3" if where == "s3" else "fake_gcs")
    if kind == "sqlite":
        store = open_store(f"sqlite:///{tmp_path / 's.db'}")
        yield emulator, emulator.url(unique_prefix("race")), store
        store.dispose()
        return
    with scratch_database(PG_ADMIN, "steptail_lake") as url:
        store = open_store(url)
        yield emulator, emulator.url(unique_prefix("race")), store
        store.dispose()


def commit_rows(store, run: str, lo: int, hi: int) -> None:
    sink = SqlSink(store)
    with store.engine.begin() as conn:
        sink.ensure_run(conn, run)
        sink.write(conn, run, Batch(loss_parts=[(run, 1, s, s * 1000, 2.0 - s / 1000, "x", '{"ce":1.5}')
                                                for s in range(lo, hi)]))


def test_appends_compaction_and_snapshots_delete_nothing(bucket, store):
    emulator, url = bucket
    before = emulator.deletes()
    lake = Lake(url, store.catalog_url(), env=emulator.env)
    for lo in range(1, 60, 10):
        assert lake.append("loss_parts", {"a": steps("a", lo, lo + 15)}) == (15 if lo == 1 else 10)
    assert lake.compact("loss_parts", "a") == (6, 1)
    objects = {path for path, _ in list_objects(lake.location, lake.props)}
    assert keys(lake, "a") == [("a", 1, s) for s in range(1, 66)]
    # a second process's view, through the catalog alone
    assert keys(Lake(url, store.catalog_url(), env=emulator.env), "a") == [("a", 1, s) for s in range(1, 66)]
    assert emulator.deletes() == before
    assert objects <= {path for path, _ in list_objects(lake.location, lake.props)}


def test_writers_racing_through_the_bucket_commit_each_key_once(bucket_and_store):
    emulator, url, store = bucket_and_store
    before = emulator.deletes()
    race(url, store.catalog_url(), env=emulator.env)
    got = keys(Lake(url, store.catalog_url(), env=emulator.env))
    assert len(got) == len(set(got))
    assert [k for k in got if k[0] == "shared"] == [("shared", 1, s) for s in range(1, 211)]
    assert emulator.deletes() == before  # the losers' manifests stay, as orphans


def test_killed_mid_commit_then_caught_up_and_read_back_equal_to_sql(bucket, store):
    emulator, url = bucket
    before = emulator.deletes()
    Lake(url, store.catalog_url(), env=emulator.env).append("loss_parts", {"a": steps("a", 1, 2)})
    assert killed_mid_commit(url, store.catalog_url(), env=emulator.env) == -9
    commit_rows(store, "a", 1, 101)
    lake = Lake(url, store.catalog_url(), env=emulator.env)
    assert catch_up_lake(store, "a", lake) == 99
    assert catch_up_lake(store, "a", Lake(url, store.catalog_url(), env=emulator.env)) == 0
    data = lake.read("loss_parts", "a")
    with store.engine.connect() as conn:
        want = conn.execute(sa.text("SELECT incarnation, step, ce FROM loss_parts WHERE run = 'a' "
                                    "ORDER BY incarnation, step")).all()
    got = sorted(zip(data["incarnation"].to_pylist(), data["step"].to_pylist(), data["ce"].to_pylist(), strict=True))
    assert got == [tuple(r) for r in want]
    assert emulator.deletes() == before


def test_a_table_made_before_a_column_was_declared_gains_it_in_the_bucket(bucket, store):
    """Schema evolution through the emulator: the older table gains the column, no DELETE."""
    emulator, url = bucket
    before = emulator.deletes()
    older_table_gains_a_column(url, store.catalog_url(), env=emulator.env)
    assert emulator.deletes() == before
