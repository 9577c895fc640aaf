"""Memory and cost of the run model's record identities (runs.identities.Identities, issue 33).

    python benchmarks/identity.py --json [--steps 100000] [--pg ADMIN_URL]

A run of --steps steps of the three record kinds (LOSS-PARTS, REQUIRED_RBF, `completed step`),
restarted every 40,000 steps from 1,000 steps back (the replay is a second incarnation's
rows), a step missing now and then. Reports:

- the index's memory per 100,000 steps: tracemalloc's count of what building it allocated
  (and still holds), and the stamps' buffers alone (Identities.nbytes);
- the time to check a record against it: a new line (stamped after everything: the common
  case, no lookup), a repeat, and a line stamped back (a lookup that finds nothing);
- the time load_model spends filling it from the store (storage.sql.load_identities): the
  rows written once into a fresh SQLite file (with --pg, a scratch database on that server)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from steptail.runs.identities import IDENTITY_TABLES, Identities  # noqa: E402
from steptail.runs.rows import COLUMNS  # noqa: E402
from steptail.storage.db import open_store  # noqa: E402
from steptail.storage.scratch import scratch_database  # noqa: E402
from steptail.storage.sql import load_identities  # noqa: E402

T0 = 1_796_011_200 * 10**9
RESTART_EVERY, REPLAY = 40_000, 1_000
SECOND = 10**9


def records(steps: int):
    """(kind, incarnation, step, ts_ns) of a run of `steps` steps in write order."""
    inc, step, t, written = 1, 0, T0, 0
    while written < steps:
        step, t, written = step + 1, t + 10 * SECOND, written + 1
        if step % 9973:  # a step missing now and then
            for kind in range(3):
                yield kind, inc, step, t + kind * 1731
        if written % RESTART_EVERY == 0:
            inc, step = inc + 1, step - REPLAY


def build(steps: int) -> tuple[Identities, int, int]:
    """The index, what building it allocated and still holds (bytes), and its peak."""
    rows = list(records(steps))  # made first: not counted
    tracemalloc.start()
    ids = Identities()
    add = ids.add
    for kind, inc, step, ts in rows:
        add(kind, inc, step, ts)
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return ids, held, peak


def lookups(ids: Identities, steps: int, n: int = 100_000) -> dict[str, float]:
    """Mean µs per check of: a new line, a repeat, a line stamped back that is new."""
    probes = {
        "new_line": [(0, s, ids.top_ns + s) for s in range(1, n + 1)],
        "repeat": [(0, step, ts) for kind, _, step, ts in records(min(steps, n)) if kind == 0],
        "stamped_back_new": [(0, s % steps + 1, T0 + (s % steps) * 10 * SECOND + 1) for s in range(n)],
    }
    out = {}
    for name, todo in probes.items():
        known = ids.known
        t0 = time.perf_counter()
        found = sum(known(kind, step, ts) for kind, step, ts in todo)
        out[name] = round((time.perf_counter() - t0) / len(todo) * 1e6, 3)
        assert found == (len(todo) if name == "repeat" else 0), (name, found)
    return out


def load_time(url: str, steps: int) -> tuple[float, int]:
    """Seconds for load_identities of a run of `steps` steps stored at `url` (best of 3)."""
    store = open_store(url)
    try:
        by_table: dict[str, list[tuple]] = {t: [] for t in IDENTITY_TABLES}
        for kind, inc, step, ts in records(steps):
            table = IDENTITY_TABLES[kind]
            row = ["bench", inc, step, ts] + [None] * (len(COLUMNS[table]) - 4)
            if table == "loss_parts":
                row[5], row[6] = "2.0", "{}"
            elif table == "required_rbf":
                row[4], row[5], row[6] = 1.0, "[]", "normal"
            else:
                row[9] = "{}"
            by_table[table].append(tuple(row))
        with store.engine.begin() as conn:
            conn.exec_driver_sql(f"INSERT INTO runs (run, created_ns, updated_ns) VALUES ('bench', {T0}, {T0})")
            for table, rows in by_table.items():
                cols = COLUMNS[table]
                marks = ", ".join([store.placeholder] * len(cols))
                conn.exec_driver_sql(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})", rows)
        best, count = float("inf"), 0
        for _ in range(3):
            with store.engine.connect() as conn:
                t0 = time.perf_counter()
                ids = load_identities(conn, "bench")
                best = min(best, time.perf_counter() - t0)
            count = sum(len(s.segs[i]) for kind in ids.kinds for s in kind.values() for i in range(len(s.segs)))
        return best, count
    finally:
        store.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--pg", metavar="ADMIN_URL", help="time the load from a scratch database on this PostgreSQL "
                    "server too (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/postgres)")
    args = ap.parse_args()

    ids, held, peak = build(args.steps)
    n_records = sum(1 for _ in records(args.steps))
    per = 100_000 / args.steps
    report = {
        "steps": args.steps,
        "records": n_records,
        "incarnations": len(ids.kinds[0]),
        "index_bytes_per_100k_steps": round(held * per),
        "index_mib_per_100k_steps": round(held * per / 2**20, 2),
        "index_peak_bytes_per_100k_steps": round(peak * per),
        "stamp_buffers_bytes_per_100k_steps": round(ids.nbytes() * per),
        "bytes_per_record": round(held / n_records, 2),
        "check_us": lookups(ids, args.steps),
    }
    with tempfile.TemporaryDirectory(prefix="steptail-bench-") as tmp:
        seconds, count = load_time(f"sqlite:///{Path(tmp) / 'ids.db'}", args.steps)
        report["load_seconds_sqlite"] = round(seconds, 3)
        assert count >= n_records
    if args.pg:
        with contextlib.ExitStack() as stack:
            url = stack.enter_context(scratch_database(args.pg, "steptail_bench"))
            report["load_seconds_postgresql"] = round(load_time(url, args.steps)[0], 3)
    if args.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:40} {v}")


if __name__ == "__main__":
    main()
