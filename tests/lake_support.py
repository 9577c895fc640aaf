"""Helpers for the lake's tests (no tests here): rows as the live path builds them, the keys a
table holds, and writers in processes of their own (racing, or killed mid-commit)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa

from steptail.storage.lake import Lake, as_lake_rows, lake_schema
from steptail.storage.parquet import to_arrow


def steps(run: str, lo: int, hi: int, inc: int = 1) -> pa.Table:
    """loss_parts rows of `run` for steps lo..hi-1, as the live path builds them."""
    return as_lake_rows("loss_parts", run, to_arrow("loss_parts", [
        (run, inc, s, 1_700_000_000_000_000_000 + s * 1_000_000, 2.0 - s / 1000, None, f'{{"ce":{2.0 - s / 1000}}}')
        for s in range(lo, hi)]))


def keys(lake: Lake, run: str | None = None) -> list[tuple]:
    data = lake.read("loss_parts", run)
    return sorted(zip(data["run"].to_pylist(), data["incarnation"].to_pylist(), data["step"].to_pylist(),
                      strict=True))


def files_on_disk(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


RACE = textwrap.dedent("""
    import sys
    from steptail.storage.lake import Lake, as_lake_rows, lake_schema
    from steptail.storage.parquet import to_arrow
    target, catalog, name, lo = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    lake = Lake(target, catalog, writer=name)
    for start in range(lo, lo + 200, 10):  # overlapping windows of the same run, and a run of its own
        rows = [("shared", 1, s, s, 1.0, None, "{}") for s in range(start, start + 15)]
        mine = [(name, 1, s, s, 1.0, None, "{}") for s in range(start, start + 10)]
        lake.append("loss_parts", {"shared": as_lake_rows("loss_parts", "shared", to_arrow("loss_parts", rows)),
                                   name: as_lake_rows("loss_parts", name, to_arrow("loss_parts", mine))})
    print(lake.commits, lake.conflicts)
""")


def race(target: str, catalog: str, writers: int = 2, env: dict | None = None) -> list[str]:
    env = {**os.environ, **(env or {}), "PYTHONWARNINGS": "ignore"}
    procs = [subprocess.Popen([sys.executable, "-c", RACE, target, catalog, f"w{i}", str(1 + 5 * i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(writers)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        assert p.returncode == 0, stderr[-2000:]
        out.append(stdout.strip())
    return out


KILLED = textwrap.dedent("""
    import os, signal, sys
    from steptail.storage.lake import Lake, as_lake_rows, lake_schema
    from steptail.storage.parquet import to_arrow
    lake = Lake(sys.argv[1], sys.argv[2])
    tbl = lake.table("loss_parts")
    # SIGKILL once the data files are written, before the catalog's pointer moves
    type(lake.catalog).commit_table = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    rows = [("a", 1, s, s, 1.0, None, "{}") for s in range(1, 101)]
    lake.append("loss_parts", {"a": as_lake_rows("loss_parts", "a", to_arrow("loss_parts", rows))})
""")


def killed_mid_commit(target: str, catalog: str, env: dict | None = None) -> int:
    """A writer SIGKILLed after its data files, before its commit: its exit code."""
    p = subprocess.run([sys.executable, "-c", KILLED, target, catalog], capture_output=True, timeout=120,
                       env={**os.environ, **(env or {})})
    return p.returncode


def older_table_gains_a_column(target: str, catalog_url: str, env: dict | None = None, on_disk=lambda: None):
    """A loss_parts table made and written by an older steptail, without today's `parts`
    column; opened now, it gains the column (optional, by name): the old rows read it as
    NULL, new rows carry it, and a second writer finds it evolved. Returns `on_disk()` as it
    was before the new writer opened the table."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import assign_fresh_schema_ids

    dropped = "parts"
    old_schema = pa.schema([f for f in lake_schema("loss_parts") if f.name != dropped])
    older = Lake(target, catalog_url, env=env)
    tbl = older.catalog.create_table(
        "steptail.loss_parts", schema=assign_fresh_schema_ids(Catalog._convert_schema_if_needed(old_schema)))
    tbl.append(steps("a", 1, 4).drop_columns([dropped]))
    before = on_disk()

    lake = Lake(target, catalog_url, env=env)
    assert lake.append("loss_parts", {"a": steps("a", 4, 6)}) == 2
    assert dropped in {f.name for f in lake.table("loss_parts").schema().fields}
    data = lake.read("loss_parts", "a").sort_by("step")
    assert data["step"].to_pylist() == [1, 2, 3, 4, 5]
    new_values = steps("a", 4, 6)[dropped].to_pylist()
    assert data[dropped].to_pylist() == [None, None, None, *new_values] and all(new_values)
    again = Lake(target, catalog_url, env=env)
    assert again.append("loss_parts", {"a": steps("a", 1, 7)}) == 1 and keys(again, "a")[-1] == ("a", 1, 6)
    return before
