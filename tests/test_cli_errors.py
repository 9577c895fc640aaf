"""The real console script: bad input exits 2 with one line and writes nothing."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

STEPTAIL = str(Path(sys.executable).with_name("steptail"))


def steptail(*args: str, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"}
    return subprocess.run([STEPTAIL, *args], cwd=cwd, input=stdin, capture_output=True, env=env, timeout=120)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("steptail: error: "), lines
    return lines[0]


@pytest.mark.parametrize(
    "args, reason",
    [
        (["ingest", "missing.log", "--run", "r"], "cannot read missing.log"),
        (["ingest", ".", "--run", "r"], "cannot read .: Is a directory"),
        (["ingest", "{sample}", "--run", "../etc"], "not a safe identifier"),
        (["ingest", "{sample}", "--run", "r", "--db", "mysql://x/y"], "unsupported database"),
        (["ingest", "{sample}", "--run", "r", "--db", "postgresql://u:hunter2@127.0.0.1:1/x"], "cannot use database"),
        (["ingest", "{sample}", "--run", "r", "--db", "nodir/x.db"], "does not exist"),
        (["steps", "nope", "--db", "other.db"], "no database at"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(args, reason, tmp_path, samples):
    args = [a.replace("{sample}", str(samples / "clean-300.log")) for a in args]
    proc = steptail(*args, cwd=tmp_path)
    line = one_line_error(proc)
    assert reason in line
    assert "hunter2" not in line  # a password is never shown
    assert list(tmp_path.iterdir()) == []


def test_corrupt_gzip_writes_nothing(tmp_path, samples):
    data = gzip.compress((samples / "clean-300.log").read_bytes())
    (tmp_path / "cut.log.gz").write_bytes(data[: len(data) // 2])
    proc = steptail("ingest", "cut.log.gz", "--run", "r", "--db", "s.db", "--parquet", "pq", cwd=tmp_path)
    assert "nothing written" in one_line_error(proc)
    proc = steptail("runs", "--db", "s.db", "--json", cwd=tmp_path)
    assert json.loads(proc.stdout) == []  # the transaction rolled back
    assert not list((tmp_path / "pq").rglob("*.parquet*")) if (tmp_path / "pq").exists() else True


def test_unknown_run_and_default_db(tmp_path, samples):
    proc = steptail("ingest", "-", "--run", "r", "--json", cwd=tmp_path,
                    stdin=(samples / "clean-300.log").read_bytes())
    assert proc.returncode == 0 and json.loads(proc.stdout)["loss_parts"] == 300
    assert (tmp_path / "steptail.db").exists()  # the embedded default
    assert "no run 'zzz'" in one_line_error(steptail("steps", "zzz", cwd=tmp_path))
    help_text = steptail("ingest", "--help", cwd=tmp_path).stdout.decode()
    assert "--parquet" in help_text and "stdin" in help_text
