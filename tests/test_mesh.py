"""`steptail mesh` and /api/mesh (storage/mesh.py): the measured mesh table, on both stores."""

from __future__ import annotations

import asyncio
import json

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from goodput_logs import timed_log
from store_fixtures import ingest_sample
from test_goodput import _http, ingest_text

from steptail.cli import main
from steptail.storage.mesh import mesh_table


@pytest.fixture
def fleet(store, samples, tmp_path):
    ingest_text(store, "timed", tmp_path / "timed.log", timed_log())
    for name in ("clean-300", "resume-gap"):
        ingest_sample(store, samples, name, name)
    with store.engine.begin() as conn:  # what follow learns from the cluster
        conn.execute(sa.text("UPDATE incarnations SET topology = '4x4', hosts = 4 WHERE run IN ('timed', 'clean-300')"))
    return store


def test_one_row_per_slice_and_mesh(fleet):
    rows = {(r["topology"], r["mesh"].get("ici_fsdp_parallelism")): r for r in mesh_table(fleet)}
    assert set(rows) == {("4x4", "8"), ("4x4", "4"), ("4x4", "-1"), (None, "-1")}
    slow, fast = rows[("4x4", "4")], rows[("4x4", "8")]
    assert slow["runs"] == fast["runs"] == ["timed"] and slow["hosts"] == 4
    assert slow["median_step_s"] == pytest.approx(20.0) and fast["median_step_s"] == pytest.approx(10.0)
    assert fast["tokens_per_s_device"] == pytest.approx(1000.0) and slow["tflops_per_device"] == pytest.approx(50.0)
    assert fast["mesh"] == {"ici_fsdp_parallelism": "8", "per_device_batch_size": "1", "max_target_length": "4096"}
    assert fast["goodput"] == pytest.approx(2500 / 3275.001, rel=0.01)
    assert slow["control"] is True  # three meshes measured on 4x4
    assert rows[(None, "-1")]["runs"] == ["resume-gap"] and rows[(None, "-1")]["control"] is None


def test_filters_by_name_and_time(fleet):
    assert {r for row in mesh_table(fleet, "resume-*") for r in row["runs"]} == {"resume-gap"}
    assert mesh_table(fleet, since_ns=2_000_000_000 * 10**9) == []
    assert {r for row in mesh_table(fleet, until_ns=1_796_011_200 * 10**9 + 10**12) for r in row["runs"]} == \
        {"timed", "clean-300", "resume-gap"}


def test_cli_and_api(fleet, db_url):
    r = CliRunner().invoke(main, ["mesh", "--db", db_url, "--run", "timed", "-o", "json"], catch_exceptions=False)
    assert r.exit_code == 0
    assert json.loads(r.output) == json.loads(json.dumps(mesh_table(fleet, "timed")))
    r = CliRunner().invoke(main, ["mesh", "--db", db_url])
    assert r.exit_code == 0 and "ici_fsdp_parallelism=4" in r.output and "20.000" in r.output
    r = CliRunner().invoke(main, ["mesh", "--db", db_url, "--since", "yesterday"])
    assert r.exit_code == 2 and "not an ISO 8601 time" in r.output
    (ok, body), (bad, _) = asyncio.run(_http(fleet, ["/api/mesh?run=timed&since=2026-11-30", "/api/mesh?until=x"]))
    assert ok == 200 and json.loads(body) == {"mesh": json.loads(json.dumps(mesh_table(fleet, "timed")))}
    assert bad == 400
