"""`--parquet DIR`'s back-fill (storage.catchup.catch_up: what SQL holds for a run and the
dataset lacks, written from SQL by key) on one big run: rows per second.

    .venv/bin/python benchmarks/backfill.py --json [--steps 1000000] [--pg ADMIN_URL]

Fills a fresh store (a SQLite file; with --pg a scratch database on that server, dropped
after) with one run of --steps steps through SqlSink — a loss_parts, a required_rbf (16
layers) and a pod_metrics row per step, shaped as the sample logs' rows, a new incarnation
every 40,000 steps — then times, in this process (best of --repeat each):

full      the back-fill into an empty dataset: `ingest`, `follow` or `export --parquet DIR` of a
          run stored without it. Rows per second.
half      the back-fill when the dataset already holds every other step (the keys read, SQL's
          rows read whole, half of them written). Rows written per second.
complete  the back-fill of a complete dataset: the check every later `ingest --parquet`,
          `follow` start and `export --parquet` pays. Seconds.

Peak RSS of the process is printed too (the rows are read and written 50,000 at a time)."""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from steptail.runs.model import Batch  # noqa: E402
from steptail.storage.catchup import catch_up, sql_rows  # noqa: E402
from steptail.storage.db import open_store  # noqa: E402
from steptail.storage.parquet import SCHEMAS, ParquetSink  # noqa: E402
from steptail.storage.scratch import scratch_database  # noqa: E402
from steptail.storage.sql import SqlSink  # noqa: E402

RUN = "bench"
INCARNATION_STEPS = 40_000
CHUNK = 50_000


def rows(first: int, last: int) -> Batch:
    """Steps first..last as the run model would hand them to the sinks (JSON as text)."""
    batch = Batch()
    for n in range(first, last + 1):
        inc, ts = 1 + (n - 1) // INCARNATION_STEPS, 1_800_000_000_000_000_000 + n * 10_000_000_000
        ce = 3.8 - n * 1e-6
        batch.loss_parts.append((RUN, inc, n, ts, ce, f"{ce:.6f}", f'{{"z_loss":1.26e-04,"moe_lb":0.0124,'
                                 f'"total":{ce + 0.0125:.6f},"tunix_loss":5.22,"weights":1048576}}'))
        layers = ",".join(f"{1 + ((n * 7 + k) % 40) / 100:.4f}" for k in range(16))
        batch.required_rbf.append((RUN, inc, n, ts, 1.39, f"[{layers}]", "first_phase"))
        batch.pod_metrics.append((RUN, inc, n, ts, 11.7, 177.2, 4037.9, 1048576, 5.22, "{}"))
    return batch


def fill(store, steps: int) -> int:
    sink = SqlSink(store)
    with store.engine.begin() as conn:
        sink.ensure_run(conn, RUN)
        for first in range(1, steps + 1, CHUNK):
            sink.write(conn, RUN, rows(first, min(steps, first + CHUNK - 1)))
    return 3 * steps


def every_other_step(store, out: Path) -> int:
    """A dataset holding the even steps only (untimed)."""
    sink, kept = ParquetSink(out, RUN), 0
    for table in SCHEMAS:
        for chunk in sql_rows(store, table, RUN, CHUNK):
            even = [r for r in chunk if r[2] % 2 == 0]
            kept += len(even)
            sink.write(Batch(**{table: even}))
    sink.commit()
    return kept


def timed(store, out: Path, prepare=None) -> tuple[float, int, int]:
    """(seconds, rows written) of a back-fill into `out`, made afresh by `prepare` (rows it holds)."""
    shutil.rmtree(out, ignore_errors=True)
    held = prepare(out) if prepare is not None else 0
    t0 = time.perf_counter()
    written = catch_up(store, RUN, out)
    return time.perf_counter() - t0, written, held


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--pg", metavar="ADMIN_URL",
                    help="a scratch database on this PostgreSQL server instead of SQLite "
                         "(e.g. postgresql+psycopg://postgres@127.0.0.1:5432/postgres)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="steptail-backfill-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        url = stack.enter_context(scratch_database(args.pg, "steptail_bench")) if args.pg \
            else f"sqlite:///{work / 'bench.db'}"
        store = open_store(url)
        stack.callback(store.dispose)
        print(f"filling {args.steps} steps …", file=sys.stderr)
        t0 = time.perf_counter()
        stored = fill(store, args.steps)
        fill_s = time.perf_counter() - t0
        out = work / "pq"
        full = min(timed(store, out) for _ in range(args.repeat))
        complete = min(timed(store, out, prepare=lambda o: catch_up(store, RUN, o))[0] for _ in range(args.repeat))
        half = min(timed(store, out, prepare=lambda o: every_other_step(store, o)) for _ in range(args.repeat))
        if full[1] != stored or half[1] != stored - half[2]:  # every row once, no more
            raise SystemExit(f"back-fill wrote {full[1]} of {stored} rows, {half[1]} of {stored - half[2]} lacking")
    report = {
        "store": "postgresql" if args.pg else "sqlite",
        "steps": args.steps,
        "rows_stored": stored,
        "fill_seconds": round(fill_s, 2),
        "full_seconds": round(full[0], 2),
        "full_rows": full[1],
        "full_rows_per_s": round(full[1] / full[0]),
        "half_seconds": round(half[0], 2),
        "half_rows_written": half[1],
        "half_rows_per_s": round(half[1] / half[0]),
        "complete_seconds": round(complete, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    if args.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:20} {v}")


if __name__ == "__main__":
    main()
