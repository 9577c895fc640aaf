"""`steptail demo`, shortened: it records, flags and tells where the data is."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)


def test_demo_records_flags_and_points_at_its_data(tmp_path):
    from steptail.storage.parquet import read_table

    out = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-c", "from steptail.cli import main; main()", "demo", "--dir", str(out),
                        "--seconds", "12", "--json"], capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert (out / "steptail.db").exists() and report["db"] == str(out / "steptail.db")
    runs = {x["run"]: x for x in report["runs"]}
    assert set(runs) == {"olmo3-sft", "qwen3-cp4"}
    olmo, qwen = runs["olmo3-sft"], runs["qwen3-cp4"]
    assert olmo["incarnations"] == 2 and olmo["reconnects"] >= 1  # JobSet restart, hang, EOF
    assert any(f["kind"] == "auth" for f in olmo["failures"] + qwen["failures"])
    assert qwen["steps_lost_to_rotation"] and qwen["stream_gaps"]
    kinds = {f["kind"] for f in qwen["findings"]}
    assert {"gap", "load_balance_rule", "nonfinite_ce"} <= kinds
    lp = read_table(out / "parquet", "loss_parts", "olmo3-sft")
    assert lp.num_rows == olmo["steps_recorded"] > 0
