"""The lake from the command line (docs/lake.md): `--parquet URL` on ingest, export and
compact, `compact --to-table`, `steptail lake catch-up` and `lake orphans`, and the Python
API's reader. The real console script in a subprocess, on both stores where the catalog
matters (SQLite, PostgreSQL), and once over moto's S3 server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from object_store_support import moto_s3, no_metadata_servers, unique_prefix  # noqa: F401

from steptail.storage.catchup import sql_rows
from steptail.storage.db import open_store
from steptail.storage.lake import SCHEMAS, TABLES, Lake, as_lake_rows
from steptail.storage.parquet import read_table, to_arrow

STEPTAIL = str(Path(sys.executable).with_name("steptail"))
ROW_TABLES = tuple(SCHEMAS)


def steptail(*args: str, cwd: Path, env: dict | None = None, expect: int | None = 0) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"}
    proc = subprocess.run([STEPTAIL, *args], cwd=cwd, capture_output=True, text=True, env=base | (env or {}),
                          timeout=300)
    if expect is not None:
        assert proc.returncode == expect, proc.stderr
    return proc


def rows(table: pa.Table) -> list[str]:
    """A table's rows, order aside (reprs: NaN equals NaN)."""
    return sorted(map(repr, table.to_pylist()))


def sql_table(store, table: str, run: str) -> pa.Table:
    held = [r for chunk in sql_rows(store, table, run) for r in chunk]
    return as_lake_rows(table, run, to_arrow(table, held))


def lake_of(db_url: str, url: str, env: dict | None = None) -> Lake:
    store = open_store(db_url, create=False)
    try:
        return Lake(url, store.catalog_url(), env=env)
    finally:
        store.dispose()


def store_of(db_url: str):
    store = open_store(db_url, create=False)
    store.engine.dispose()  # read once, then the pool is let go (no file or connection kept)
    return store


def assert_lake_is_sql(db_url: str, lake: Lake, run: str) -> None:
    store = open_store(db_url, create=False)
    try:
        for table in ROW_TABLES:
            want = sql_table(store, table, run)
            assert rows(lake.read(table, run)) == rows(want), table
    finally:
        store.dispose()


def snapshots(lake: Lake) -> dict[str, int | None]:
    out = {}
    for name in TABLES:
        tbl = lake.table(name, create=False)
        if tbl is not None:
            tbl.refresh()
        out[name] = None if tbl is None else len(tbl.metadata.snapshots)
    return out


def test_ingest_into_the_lake_equals_sql_row_for_row_and_twice_adds_nothing(db_url, samples, tmp_path):
    url = f"file://{tmp_path / 'lake'}"
    log = str(samples / "resume-gap.log")  # two incarnations, a replay, a gap
    proc = steptail("ingest", log, "--run", "rg", "--db", db_url, "--parquet", url, "--json", cwd=tmp_path)
    first = json.loads(proc.stdout)["lake"]
    assert first["location"] == url and first["error"] is None and first["rows_added"] > 426
    lake = lake_of(db_url, url)
    assert_lake_is_sql(db_url, lake, "rg")
    assert lake.read("loss_parts", "rg").num_rows == 426
    before = snapshots(lake)

    proc = steptail("ingest", log, "--run", "rg", "--db", db_url, "--parquet", url, "--json", cwd=tmp_path)
    assert json.loads(proc.stdout)["lake"]["rows_added"] == 0
    assert_lake_is_sql(db_url, lake, "rg")  # no duplicate
    assert {t: n for t, n in snapshots(lake).items() if t in ROW_TABLES} == \
        {t: n for t, n in before.items() if t in ROW_TABLES}  # nothing appended: no commit

    text = steptail("ingest", log, "--run", "rg", "--db", db_url, "--parquet", url, cwd=tmp_path).stdout
    assert f"lake: {url}: 0 rows added" in text


def test_a_lake_behind_is_filled_by_catch_up(db_url, samples, tmp_path):
    url = f"file://{tmp_path / 'lake'}"
    for run, name in (("a", "clean-300"), ("b", "resume-gap")):
        steptail("ingest", str(samples / f"{name}.log"), "--run", run, "--db", db_url, cwd=tmp_path)
    steptail("ingest", str(samples / "clean-300.log"), "--run", "a", "--db", db_url, "--parquet", url, cwd=tmp_path)
    lake = lake_of(db_url, url)
    assert lake.read("loss_parts", "b").num_rows == 0  # behind: b never went to the lake

    out = steptail("lake", "catch-up", url, "b", "--db", db_url, "--json", cwd=tmp_path).stdout
    assert json.loads(out)[0]["run"] == "b" and json.loads(out)[0]["rows_added"] > 0
    for run in ("a", "b"):
        assert_lake_is_sql(db_url, lake, run)
    out = steptail("lake", "catch-up", url, "--db", db_url, cwd=tmp_path).stdout
    assert out.splitlines() == ["a: 0 rows added", "b: 0 rows added"]

    proc = steptail("lake", "catch-up", url, "nope", "--db", db_url, cwd=tmp_path, expect=2)
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "no run 'nope'" in proc.stderr


def test_compact_to_table_converts_a_local_dataset_once(db_url, samples, tmp_path):
    pq, url = tmp_path / "parquet", f"file://{tmp_path / 'lake'}"
    for run, name in (("a", "clean-300"), ("b", "resume-gap"), ("c", "cp4-lb-nan")):
        steptail("ingest", str(samples / f"{name}.log"), "--run", run, "--db", db_url, "--parquet", str(pq),
                 cwd=tmp_path)
    steptail("ingest", str(samples / "clean-300.log"), "--run", "a", "--db", db_url, "--parquet", str(pq),
             cwd=tmp_path)  # again: nothing added, the dataset as it was

    proc = steptail("compact", "--parquet", str(pq), "--to-table", url, "--db", db_url, cwd=tmp_path)
    assert proc.stdout.splitlines()[:3] == [line for line in proc.stdout.splitlines()[:3] if " rows read, " in line]
    lake = lake_of(db_url, url)
    for run in ("a", "b", "c"):
        for table in TABLES:
            local = as_lake_rows(table, run, read_table(pq, table, run))
            assert rows(lake.read(table, run)) == rows(local), (run, table)
        assert lake.read("loss_parts", run).num_rows == sql_table(store_of(db_url), "loss_parts", run).num_rows
    before = snapshots(lake)

    again = json.loads(steptail("compact", "--parquet", str(pq), "--to-table", url, "--db", db_url, "--json",
                                cwd=tmp_path).stdout)
    assert [(d["run"], d["rows_added"]) for d in again] == [("a", 0), ("b", 0), ("c", 0)]
    assert all(d["rows_read"] > 0 for d in again)
    assert snapshots(lake) == before  # a rerun commits nothing

    one = json.loads(steptail("compact", "b", "--parquet", str(pq), "--to-table", url, "--db", db_url, "-o", "json",
                              cwd=tmp_path).stdout)
    assert [d["run"] for d in one] == ["b"]


def test_compact_and_export_compact_the_lakes_files(samples, tmp_path):
    """Two ingests of halves of a log: two files per table; compact leaves one, same rows."""
    db, url = str(tmp_path / "s.db"), f"file://{tmp_path / 'lake'}"
    lines = (samples / "clean-300.log").read_text().splitlines(keepends=True)
    (tmp_path / "one.log").write_text("".join(lines[: len(lines) // 2]))
    (tmp_path / "two.log").write_text("".join(lines[len(lines) // 2:]))
    for part in ("one.log", "two.log"):
        steptail("ingest", part, "--run", "a", "--db", db, "--parquet", url, cwd=tmp_path)
    lake = lake_of(f"sqlite:///{db}", url)
    want = rows(lake.read("loss_parts", "a"))
    assert len(want) == 300

    done = json.loads(steptail("compact", "--parquet", url, "--db", db, "--json", cwd=tmp_path).stdout)
    loss = [d for d in done if d["table"] == "loss_parts"]
    assert loss == [{"table": "loss_parts", "run": "a", "files_before": 2, "files_after": 1, "rewritten": True}]
    assert rows(lake.read("loss_parts", "a")) == want
    assert_lake_is_sql(f"sqlite:///{db}", lake, "a")
    again = json.loads(steptail("compact", "a", "--parquet", url, "--db", db, "--json", cwd=tmp_path).stdout)
    assert not any(d["rewritten"] for d in again)

    steptail("ingest", str(samples / "clean-300.log"), "--run", "a", "--db", db, "--parquet", url, cwd=tmp_path)
    out = json.loads(steptail("export", "a", "--out", "ledger", "--db", db, "--parquet", url, "--json",
                              cwd=tmp_path).stdout)
    assert out["lake"]["rows_added"] == 0 and out["lake"]["files_after"] <= out["lake"]["files_before"]
    assert (tmp_path / "ledger" / "loss_parts.parquet").is_file()  # the bundle stays plain Parquet
    assert rows(lake.read("loss_parts", "a")) == want


def test_orphans_are_reported_and_nothing_is_deleted(samples, tmp_path):
    db, folder = str(tmp_path / "s.db"), tmp_path / "lake"
    url = f"file://{folder}"
    steptail("ingest", str(samples / "resume-gap.log"), "--run", "rg", "--db", db, "--parquet", url, cwd=tmp_path)
    report = json.loads(steptail("lake", "orphans", url, "--db", db, "--json", cwd=tmp_path).stdout)
    assert report["count"] == 0 and report["deleted"] == 0 and report["objects"] > 0

    planted = folder / "steptail" / "loss_parts" / "data" / "run=rg" / "00000-0-failed-attempt.parquet"
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_bytes(b"x" * 1234)
    files = {p: p.stat().st_size for p in folder.rglob("*") if p.is_file()}
    report = json.loads(steptail("lake", "orphans", url, "--db", db, "--json", cwd=tmp_path).stdout)
    assert report["orphans"] == [{"uri": f"file://{planted}", "bytes": 1234}]
    assert report["count"] == 1 and report["bytes"] == 1234 and report["objects"] == len(files)
    text = steptail("lake", "orphans", url, "--db", db, cwd=tmp_path).stdout
    assert str(planted) in text and "1 orphan (1234 bytes)" in text and "nothing deleted" in text
    assert {p: p.stat().st_size for p in folder.rglob("*") if p.is_file()} == files  # deleted nothing
    assert "deletes nothing" in steptail("lake", "orphans", "--help", cwd=tmp_path).stdout


@pytest.mark.parametrize("args, reason", [
    (["ingest", "{log}", "--run", "r", "--parquet", "http://host/x"], "scheme 'http' is not file, s3 or gs"),
    (["ingest", "{log}", "--run", "r", "--parquet", "gcs://bucket/x"], "(use gs://)"),
    (["ingest", "{log}", "--run", "r", "--parquet", "s3://Bad_Bucket/x"], "not a valid s3 bucket name"),
    (["ingest", "{log}", "--run", "r", "--parquet", "file://host/x"], "names a host"),
    (["ingest", "{log}", "--run", "r", "--parquet", "s3://bucket/a/../b"], "'..' part"),
    (["export", "r", "--out", "x", "--parquet", "gs:bucket"], "without '//'"),
    (["compact", "--parquet", "s3://bucket/x/../y"], "'..' part"),
    (["compact", "--parquet", "pq", "--to-table", "ftp://bucket/x"], "scheme 'ftp'"),
    (["compact", "--parquet", "s3://bucket/x", "--to-table", "s3://bucket/y"], "must be a folder"),
    (["lake", "catch-up", "gcs://bucket/x"], "(use gs://)"),
    (["lake", "orphans", "s3://bucket/x?versionId=1"], "'?' or '#'"),
    (["archive", "--jobset", "j", "--out", "arch", "--parquet", "s3://bucket-b/x"], "AWS_ACCESS_KEY_ID is set without"),
    (["follow", "--jobset", "j", "--parquet", "s3://bucket-b"], "AWS_ACCESS_KEY_ID is set without"),
])
def test_a_bad_table_location_is_one_line_exit_2_and_writes_nothing(args, reason, samples, tmp_path):
    args = [a.replace("{log}", str(samples / "clean-300.log")) for a in args]
    proc = steptail(*args, cwd=tmp_path, env={"AWS_ACCESS_KEY_ID": "half-a-pair"}, expect=2)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("steptail: error: ") and reason in lines[0], lines
    assert "half-a-pair" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_another_location_than_the_stores_lake_is_refused(samples, tmp_path):
    """The catalog holds one table of each name: a second location would be written at the first."""
    log, db = str(samples / "clean-300.log"), str(tmp_path / "s.db")
    steptail("ingest", log, "--run", "a", "--db", db, "--parquet", f"file://{tmp_path / 'lake'}", cwd=tmp_path)
    other = f"file://{tmp_path / 'other'}"
    for args in (["ingest", log, "--run", "b"], ["lake", "catch-up", other], ["compact"]):
        args = [*args, "--db", db] + (["--parquet", other] if args[0] != "lake" else [])
        proc = steptail(*args, cwd=tmp_path, expect=2)
        assert "this store's lake is at" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "other").exists()
    assert json.loads(steptail("runs", "--db", db, "--json", cwd=tmp_path).stdout)[0]["run"] == "a"  # b: nothing


def test_every_parquet_option_says_it_takes_a_table_location(tmp_path):
    for command in ("ingest", "archive", "export", "compact", "follow"):
        text = " ".join(steptail(command, "--help", cwd=tmp_path).stdout.split())
        assert "s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, file:///DIR (an Iceberg table; the catalog in --db)" in text
        assert "gs://my-bucket/steptail" in text or "s3://my-bucket/steptail" in text  # an example


def test_the_api_reads_the_lake_through_its_tables(db_url, samples, tmp_path):
    import steptail as api

    url = f"file://{tmp_path / 'lake'}"
    steptail("ingest", str(samples / "resume-gap.log"), "--run", "rg", "--db", db_url, "--parquet", url, cwd=tmp_path)
    with api.open(db_url) as st:
        frame = st.lake("loss_parts", url, run="rg")
        steps = st.steps("rg", parts="dict")
        assert len(frame) == len(steps) == 426
        frame = frame.sort_values(["incarnation", "step"]).reset_index(drop=True)
        assert frame["step"].tolist() == steps["step"].tolist()
        assert frame["incarnation"].tolist() == steps["incarnation"].tolist()
        assert (frame["ts"] - steps["ts"]).abs().max().value < 1000  # microseconds kept
        assert frame["ce"].tolist() == pytest.approx(steps["ce"].tolist(), nan_ok=True)
        assert str(frame["ts"].dtype) == "datetime64[ns, UTC]" and isinstance(frame["parts"][0], dict)
        assert set(st.lake("loss_parts", url)["run"]) == {"rg"}
        assert len(st.lake("findings", url, run="rg")) == len(st.findings("rg"))
        assert st.lake("loss_parts", url, run="nope").empty
        with pytest.raises(ValueError, match="no lake table"):
            st.lake("runs", url)


def test_ingest_to_s3_then_orphans_deletes_nothing(moto_s3, samples, tmp_path):  # noqa: F811
    prefix = unique_prefix("lake-cli")
    url, db = moto_s3.url(prefix), str(tmp_path / "s.db")
    env = dict(moto_s3.env)
    proc = steptail("ingest", str(samples / "resume-gap.log"), "--run", "rg", "--db", db, "--parquet", url,
                    "--json", cwd=tmp_path, env=env)
    assert json.loads(proc.stdout)["lake"]["error"] is None
    proc = steptail("ingest", str(samples / "resume-gap.log"), "--run", "rg", "--db", db, "--parquet", url,
                    "--json", cwd=tmp_path, env=env)
    assert json.loads(proc.stdout)["lake"]["rows_added"] == 0
    lake = lake_of(f"sqlite:///{db}", url, env)
    assert_lake_is_sql(f"sqlite:///{db}", lake, "rg")
    report = json.loads(steptail("lake", "orphans", url, "--db", db, "--json", cwd=tmp_path, env=env).stdout)
    assert report["objects"] > 0 and report["deleted"] == 0
    assert all(o["uri"].startswith(f"{url}/") for o in report["orphans"])
    assert moto_s3.deletes(prefix) == 0


def test_archive_into_the_lake_equals_sql(make_simcluster, tmp_path):
    """archive --parquet URL: process 0 ingested, then the lake brought up to date from SQL."""
    sim = make_simcluster({"rate": 100, "jobsets": [{"name": "sft", "hosts": 2,
                                                     "trainer": {"steps": 120, "checkpoint_period": 50}}]})
    sim.wait_done("sft", timeout=60)
    db, url = str(tmp_path / "s.db"), f"file://{tmp_path / 'lake'}"
    argv = [STEPTAIL, "archive", "--jobset", "sft", "--out", str(tmp_path / "archive"), "--db", db,
            "--parquet", url, "-o", "json"]
    proc = subprocess.run(argv, env=sim.env(), capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lake = json.loads(proc.stdout)["ingest"]["lake"]
    assert lake["location"] == url and lake["error"] is None and lake["rows_added"] >= 120
    store_url = f"sqlite:///{db}"
    assert_lake_is_sql(store_url, lake_of(store_url, url), "sft")
    assert lake_of(store_url, url).read("loss_parts", "sft").num_rows == 120
