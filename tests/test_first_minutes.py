"""The first five minutes: `make demo` installs the product only (the test tools come with
`make test`); a command that writes nothing leaves no store or lock file behind; counts in
command output take the singular for one (no "(s)"); `compact`, which can run for seconds,
shows progress on a terminal as `export` and `reparse` do (tests/test_export.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from steptail.commands._common import count
from steptail.storage.db import open_store, remove_unused_store

ROOT = Path(__file__).resolve().parents[1]
STEPTAIL = str(Path(sys.executable).parent / "steptail")


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"}
    return subprocess.run([STEPTAIL, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=120)


def make_n(target: str, tmp_path: Path) -> str:
    """What `make TARGET` would run on a machine without the venv (make -n: nothing runs)."""
    proc = subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={tmp_path / 'venv'}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_demo_installs_the_product_and_make_test_the_test_tools(tmp_path):
    demo = make_n("demo", tmp_path)
    assert "pip install --quiet -e .\n" in demo and "[dev]" not in demo, demo
    for target in ("test", "lint", "dev"):
        assert "pip install --quiet -e '.[dev]'" in make_n(target, tmp_path), target


def test_an_ingest_with_nothing_to_write_leaves_no_store(tmp_path, samples):
    proc = cli("ingest", str(samples / "README.md"), "--run", "readme", cwd=tmp_path)
    assert proc.returncode == 1 and "nothing written" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no steptail.db, no steptail.db.lock
    # a store that was there stays, with what it holds
    assert cli("ingest", str(samples / "clean-300.log"), "--run", "c", cwd=tmp_path).returncode == 0
    assert cli("ingest", str(samples / "README.md"), "--run", "readme", cwd=tmp_path).returncode == 1
    assert "c " in cli("runs", cwd=tmp_path).stdout


READERS = (("runs",), ("steps", "c"), ("check", "c"), ("goodput", "c"), ("compare", "c", "d"),
           ("export", "c", "--out", "ledger"), ("mesh",), ("reparse", "c", "--raw", "raw"),
           ("compact", "--parquet", "file:///nowhere/lake"), ("lint", "m.yaml", "--control-run", "c"))


def test_reading_commands_make_no_store_and_no_lock_file(tmp_path, samples):
    (tmp_path / "raw").mkdir()
    shutil.copy(ROOT / "tests" / "manifests" / "good.yaml", tmp_path / "m.yaml")
    for args in READERS:  # each on a store that is not there: refused, and nothing made
        proc = cli(*args, "--db", "sqlite:///new.db", cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m.yaml", "raw"], args
    (tmp_path / "raw").rmdir()
    (tmp_path / "m.yaml").unlink()
    assert cli("ingest", str(samples / "clean-300.log"), "--run", "c", cwd=tmp_path).returncode == 0
    (tmp_path / "steptail.db.lock").unlink()  # a store copied here without it
    for args in (("check", "nope"), ("steps", "nope"), ("runs",), ("check", "c")):
        assert cli(*args, cwd=tmp_path).returncode in (0, 2), args
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steptail.db"]


def test_a_store_in_use_or_holding_a_run_is_never_removed(tmp_path, samples):
    from store_fixtures import ingest_sample

    empty = tmp_path / "empty.db"
    store = open_store(str(empty))
    try:
        with store.engine.connect():  # another process's connection: its WAL index is there
            assert not remove_unused_store(empty) and empty.exists()
    finally:
        store.dispose()
    held = tmp_path / "held.db"
    store = open_store(str(held))
    ingest_sample(store, samples, "c", "clean-300")
    store.dispose()
    assert not remove_unused_store(held) and held.exists()
    assert remove_unused_store(empty) and not empty.exists() and not (tmp_path / "empty.db.lock").exists()


def test_one_is_singular(tmp_path, samples):
    assert (count(1, "step"), count(2, "step"), count(0, "process", "processes")) == ("1 step", "2 steps", "0 processes")
    assert cli("ingest", str(samples / "clean-300.log"), "--run", "c", cwd=tmp_path).returncode == 0
    out = cli("export", "c", "--out", "ledger", cwd=tmp_path).stdout
    assert out.rstrip().endswith(", 1 incarnation") and "0 findings" in out, out
    outputs = [cli("ingest", str(samples / "resume-gap.log"), "--run", "rg", cwd=tmp_path).stdout,
               cli("check", "rg", cwd=tmp_path).stdout,
               cli("lint", str(ROOT / "tests" / "manifests" / "bad.yaml"), cwd=tmp_path).stdout]
    assert "; 2 incarnations; 0 bad lines; " in outputs[0], outputs[0]
    assert " findings, " in outputs[1] and " steps missing: " in outputs[1], outputs[1]
    assert "1 JobSet: " in outputs[2] or "JobSets: " in outputs[2], outputs[2]
    for out in outputs:
        assert "(s)" not in out, out


def test_compact_draws_a_bar_on_a_terminal_only(tmp_path, samples):
    """One run's tables: compacting a big run takes seconds too, so the bar is not kept for
    several runs only. Piped, stderr stays empty."""
    from test_terminal import on_terminal

    for n in (1, 2):  # two ingests: two parts per table to compact
        log = tmp_path / f"part{n}.log"
        lines = (samples / "clean-300.log").read_text().splitlines(keepends=True)
        half = len(lines) // 2
        log.write_text("".join(lines[:half] if n == 1 else lines[half:]))
        assert cli("ingest", str(log), "--run", "c", "--parquet", "pq", cwd=tmp_path).returncode == 0
    env = {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"}
    code, text = on_terminal([STEPTAIL, "compact", "c", "--parquet", str(tmp_path / "pq")], env=env)
    assert code == 0 and "compact" in text.split("1 run:")[0] and "1 run: " in text, text
    piped = cli("compact", "c", "--parquet", "pq", cwd=tmp_path)
    assert piped.returncode == 0 and piped.stderr == "" and piped.stdout.startswith("1 run: "), piped
