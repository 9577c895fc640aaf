"""A lake whose bucket does not exist (issue 34, row 9): checked at start like the URL and the
catalog, one line and exit 2, nothing written to the store, on both emulators (moto's S3 and
fake-gcs-server) and both stores. A bucket that exists still passes (one metadata request)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from object_store_support import unique_prefix
from sim_fixtures import simcluster  # noqa: F401

from steptail.storage.db import open_store
from steptail.storage.lake import Lake, LakeError

pytestmark = pytest.mark.timeout(180)
STEPTAIL = str(Path(sys.executable).with_name("steptail"))
SAMPLE = Path(__file__).resolve().parent / "samples" / "clean-300.log"
MISSING = "no-such-bucket-steptail"


@pytest.fixture(params=["s3", "gs"])
def emulator(request):
    return request.getfixturevalue("moto_s3" if request.param == "s3" else "fake_gcs")


def run(*args: str, env: dict) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"}
    return subprocess.run([STEPTAIL, *args], capture_output=True, text=True, env=base | env, timeout=150)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("steptail: error: "), lines
    return lines[0]


def stored_runs(db: str) -> list:
    store = open_store(db, create=False)
    try:
        with store.engine.connect() as conn:
            return conn.execute(sa.text("SELECT DISTINCT run FROM loss_parts")).all()
    finally:
        store.dispose()


def test_ingest_into_a_missing_bucket_is_refused_before_anything_is_written(emulator, db_url):
    url = f"{emulator.kind}://{MISSING}/{unique_prefix('lake')}"
    line = one_line_error(run("ingest", str(SAMPLE), "--run", "r9", "--db", db_url, "--parquet", url,
                              env=emulator.env))
    assert f"bucket {emulator.kind}://{MISSING} does not exist" in line
    assert stored_runs(db_url) == []
    # the bucket that exists: the same ingest goes through
    ok = run("ingest", str(SAMPLE), "--run", "r9", "--db", db_url, "--parquet",
             emulator.url(unique_prefix("lake")), env=emulator.env)
    assert ok.returncode == 0 and "warning" not in ok.stderr, ok.stderr
    assert stored_runs(db_url) == [("r9",)]


def test_follow_into_a_missing_bucket_is_refused_at_start(moto_s3, simcluster, tmp_path):  # noqa: F811
    sim = simcluster
    url = f"s3://{MISSING}/{unique_prefix('lake')}"
    db = f"sqlite:///{tmp_path / 's.db'}"
    line = one_line_error(run("follow", "--all", "-n", "default", "--kubeconfig", str(sim.kubeconfig_path),
                              "--db", db, "--parquet", url, "--no-view",
                              env=moto_s3.env | {"CLOUDSDK_CORE_ACCOUNT": sim.account}))
    assert f"bucket s3://{MISSING} does not exist" in line


def test_an_unreachable_store_is_one_line_too(store, no_metadata_servers):
    env = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_REGION": "us-east-1",
           "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"}  # a closed port
    lake = Lake(f"s3://{MISSING}/lake", store.catalog_url(), env=env)
    with pytest.raises(LakeError, match="cannot reach the lake's bucket") as caught:
        lake.check_bucket()
    assert "\n" not in str(caught.value)
