"""The lake (storage.lake): Iceberg tables with the catalog in the store's database, appended
exactly once by key across retries, crashes and racing writers, and nothing ever deleted.
Local folders here on both catalogs (SQLite, PostgreSQL); the object stores in
tests/test_lake_object_stores.py."""

from __future__ import annotations

import pyarrow as pa
import pytest
from lake_support import (
    files_on_disk,
    keys,
    killed_mid_commit,
    older_table_gains_a_column,
    race,
    steps,
)

from steptail.runs.model import Batch
from steptail.storage.catchup import catch_up_lake
from steptail.storage.lake import Lake, LakeError, as_lake_rows, is_lake, lake_schema
from steptail.storage.parquet import to_arrow
from steptail.storage.sql import SqlSink


@pytest.fixture
def lake(store, tmp_path):
    return Lake(f"file://{tmp_path / 'lake'}", store.catalog_url())


def test_is_lake_tells_a_table_location_from_a_dataset_folder():
    assert is_lake("gs://b/steptail") and is_lake("s3://b/p") and is_lake("file:///data/lake")
    assert not is_lake("/data/parquet") and not is_lake("parquet") and not is_lake(None)


def test_a_bad_location_is_one_line(store):
    with pytest.raises(LakeError, match="bad table location 'http://x/y'"):
        Lake("http://x/y", store.catalog_url())


def test_appends_are_exactly_once_by_key(lake):
    assert lake.append("loss_parts", {"a": steps("a", 1, 11)}) == 10
    assert lake.append("loss_parts", {"a": steps("a", 5, 16), "b": steps("b", 1, 4)}) == 8
    assert lake.append("loss_parts", {"a": steps("a", 1, 16)}) == 0  # a retry of what landed
    doubled = pa.concat_tables([steps("a", 16, 18), steps("a", 16, 18)])  # a key twice in one batch
    assert lake.append("loss_parts", {"a": doubled}) == 2
    assert lake.append("loss_parts", {"a": steps("a", 1, 3, inc=2)}) == 2  # a restart's replay
    want = [("a", 1, s) for s in range(1, 18)] + [("a", 2, 1), ("a", 2, 2)] + [("b", 1, s) for s in range(1, 4)]
    assert keys(lake) == sorted(want)
    assert keys(lake, "b") == [("b", 1, 1), ("b", 1, 2), ("b", 1, 3)]


def test_small_tables_are_keyed_by_their_own_keys(lake):
    config = as_lake_rows("config", "a", to_arrow("config", [("a", 1, "lr", "1e-5"), ("a", 1, "bs", "64")]))
    assert lake.append("config", {"a": config}) == 2
    again = as_lake_rows("config", "a", to_arrow("config", [("a", 1, "lr", "1e-5"), ("a", 2, "lr", "2e-5")]))
    assert lake.append("config", {"a": again}) == 1
    assert sorted(lake.read("config", "a")["name"].to_pylist()) == ["bs", "lr", "lr"]


def test_a_second_writer_sees_what_the_first_committed(lake, store, tmp_path):
    """A handover: the new owner's Lake continues from the table's own record."""
    lake.append("loss_parts", {"a": steps("a", 1, 50)})
    other = Lake(f"file://{tmp_path / 'lake'}", store.catalog_url(), writer="replica-2")
    assert other.append("loss_parts", {"a": steps("a", 1, 60)}) == 10
    # the first writer's cache is stale now: another writer touched run a, so it re-reads
    assert lake.append("loss_parts", {"a": steps("a", 55, 70)}) == 10
    assert keys(lake, "a") == [("a", 1, s) for s in range(1, 70)]


def test_a_commit_that_raised_after_it_landed_is_not_redone(lake, monkeypatch):
    tbl = lake.table("loss_parts")
    real = type(tbl).append
    calls = []

    def lands_then_raises(self, df, *args, **kwargs):
        calls.append(df.num_rows)
        real(self, df, *args, **kwargs)
        if len(calls) == 1:
            raise OSError("connection reset by peer")  # the reply lost, the commit done

    monkeypatch.setattr(type(tbl), "append", lands_then_raises)
    assert lake.append("loss_parts", {"a": steps("a", 1, 21)}) == 20
    assert calls == [20]  # found landed by its batch id: not committed twice
    assert keys(lake, "a") == [("a", 1, s) for s in range(1, 21)]


def test_a_commit_that_failed_is_an_error_and_nothing_half_written(lake, monkeypatch):
    tbl = lake.table("loss_parts")
    lake.append("loss_parts", {"a": steps("a", 1, 5)})

    def refused(self, *args, **kwargs):
        raise PermissionError("403 Forbidden")

    monkeypatch.setattr(type(tbl), "append", refused)
    with pytest.raises(LakeError, match="lake commit failed: 403 Forbidden"):
        lake.append("loss_parts", {"a": steps("a", 5, 10)})
    monkeypatch.undo()
    assert keys(lake, "a") == [("a", 1, s) for s in range(1, 5)]


def test_writers_racing_on_one_run_commit_each_key_once(lake, store, tmp_path):
    """Two processes append overlapping windows of one run at once: every key once."""
    race(f"file://{tmp_path / 'lake'}", store.catalog_url())
    got = keys(lake)
    assert len(got) == len(set(got))
    assert [k for k in got if k[0] == "shared"] == [("shared", 1, s) for s in range(1, 211)]
    assert [k for k in got if k[0] == "w0"] == [("w0", 1, s) for s in range(1, 201)]
    assert [k for k in got if k[0] == "w1"] == [("w1", 1, s) for s in range(6, 206)]


def test_killed_between_data_files_and_commit_then_caught_up_from_sql(store, tmp_path):
    """The data files of a commit that never happened are orphans: not read, not deleted; the
    catch-up from SQL then writes every row once."""
    target = f"file://{tmp_path / 'lake'}"
    lake = Lake(target, store.catalog_url())
    lake.append("loss_parts", {"a": steps("a", 1, 2)})
    before = files_on_disk(tmp_path / "lake")
    assert killed_mid_commit(target, store.catalog_url()) == -9
    orphans = files_on_disk(tmp_path / "lake") - before
    assert any(p.suffix == ".parquet" for p in orphans)  # written, never committed
    assert keys(Lake(target, store.catalog_url()), "a") == [("a", 1, 1)]

    sink = SqlSink(store)
    with store.engine.begin() as conn:
        sink.ensure_run(conn, "a")
        sink.write(conn, "a", Batch(loss_parts=[("a", 1, s, s, 1.0, "1.0", "{}") for s in range(1, 101)]))
    fresh = Lake(target, store.catalog_url())
    assert catch_up_lake(store, "a", fresh) == 99
    assert catch_up_lake(store, "a", fresh) == 0  # nothing twice
    assert keys(fresh, "a") == [("a", 1, s) for s in range(1, 101)]
    assert orphans <= files_on_disk(tmp_path / "lake")  # nothing deleted
    referenced = set().union(*fresh.files().values())
    assert not {f"file://{p}" for p in orphans} & referenced


def test_replace_and_compact_add_files_and_delete_none(lake, tmp_path):
    for lo in range(1, 100, 10):
        lake.append("loss_parts", {"a": steps("a", lo, lo + 10)})
    findings = lambda detail: as_lake_rows("findings", "a", pa.table({  # noqa: E731
        "kind": ["gap"], "incarnation": pa.array([1], pa.int32()), "first_step": [5], "last_step": [6],
        "detail": [detail], "severity": ["critical"], "detected": pa.array([1], pa.timestamp("ns", tz="UTC"))}))
    lake.replace("findings", {"a": findings("first")})
    lake.replace("findings", {"a": findings("second")})
    assert lake.read("findings", "a")["detail"].to_pylist() == ["second"]
    before = files_on_disk(tmp_path / "lake")
    assert lake.compact("loss_parts", "a") == (10, 1)
    assert lake.compact("loss_parts", "a") == (1, 1)  # nothing to do
    assert keys(lake, "a") == [("a", 1, s) for s in range(1, 101)]
    assert before <= files_on_disk(tmp_path / "lake")


def test_reading_a_table_never_written_is_empty(lake):
    assert lake.read("required_rbf").schema == lake_schema("required_rbf")
    assert lake.read("required_rbf", "nope").num_rows == 0



def test_a_table_made_before_a_column_was_declared_gains_it(store, tmp_path):
    """A lake table written by an older steptail, without a column of today's schema: opened
    now it gains the column (lake_support.older_table_gains_a_column); nothing is rewritten."""
    root = tmp_path / "lake"
    before = older_table_gains_a_column(f"file://{root}", store.catalog_url(),
                                        on_disk=lambda: files_on_disk(root))
    assert before <= files_on_disk(root)  # added to, nothing rewritten or deleted
