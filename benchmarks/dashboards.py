"""Latency of the Run dashboard's CE panel queries on PostgreSQL (100 runs x 20k steps by
default) and of GET /api/runs/{run}/steps for one 20k-step run, over a real socket.

    .venv/bin/python benchmarks/dashboards.py --json [--runs 100] [--steps 20000]

Loads a scratch database (unique name, dropped afterwards) with COPY, then times each query
`--reps` times after one warm-up and reports median and max in milliseconds."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from steptail.dashboards import queries as q  # noqa: E402
from steptail.dashboards.macros import Context, TimeRange, Variable, expand  # noqa: E402
from steptail.storage.db import open_store
from steptail.storage.scratch import scratch_database  # noqa: E402

PG_ADMIN = os.environ.get("STEPTAIL_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
T0_NS = 1_795_000_000 * 10**9  # 2026-11-18
STEP_NS = 12 * 10**9
LAYERS = 16


def _load(store, runs: int, steps: int) -> None:
    raw = store.engine.raw_connection()
    try:
        cur = raw.cursor()
        now = time.time_ns()
        with cur.copy("COPY runs (run, jobset, namespace, created_ns, updated_ns) FROM STDIN") as cp:
            for r in range(runs):
                cp.write_row((f"run-{r:03d}", f"js-{r:03d}", "bench", now, now))
        with cur.copy("COPY incarnations (run, incarnation, started_ns, saw_start, first_step,"
                      " last_step) FROM STDIN") as cp:
            for r in range(runs):
                cp.write_row((f"run-{r:03d}", 1, T0_NS, True, 1, steps))
        with cur.copy("COPY loss_parts (run, incarnation, step, ts_ns, ce, ce_raw, parts)"
                      " FROM STDIN") as cp:
            for r in range(runs):
                run = f"run-{r:03d}"
                for s in range(1, steps + 1):
                    ce = 4.0 - 2.0 * s / steps + (r % 7) * 0.01
                    cp.write_row((run, 1, s, T0_NS + s * STEP_NS, ce, f"{ce:.6f}",
                                  '{"z_loss":0.0001,"moe_lb":0.0124,"weights":1048576}'))
        with cur.copy("COPY required_rbf (run, incarnation, step, ts_ns, max, per_layer, program)"
                      " FROM STDIN") as cp:
            for s in range(1, steps + 1):  # the run served by the API has the probe
                layers = [1.0 + ((s * 7 + k * 13) % 100) / 40 for k in range(LAYERS)]
                cp.write_row(("run-000", 1, s, T0_NS + s * STEP_NS + 1000, max(layers),
                              json.dumps(layers), "first_phase"))
        raw.commit()
        cur.execute("ANALYZE")
        raw.commit()
    finally:
        raw.close()


def _timed(fn, reps: int) -> dict:
    fn()  # warm-up (plan cache, buffers)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        rows = fn()
        times.append((time.perf_counter() - t) * 1000)
    return {"median_ms": round(statistics.median(times), 2), "max_ms": round(max(times), 2),
            "rows": rows, "reps": reps}


def _sql_latency(store, sql: str, runs: list[str], steps: int, reps: int) -> dict:
    start = datetime.fromtimestamp(T0_NS / 1e9, UTC)
    end = datetime.fromtimestamp((T0_NS + (steps + 1) * STEP_NS) / 1e9, UTC)
    ctx = Context(TimeRange(start, end), {"run": Variable(runs, multi=True),
                                          "namespace": Variable(["bench"], multi=True, include_all=True)})
    text = sa.text(expand(sql, ctx).replace(":", r"\:"))

    def run() -> int:
        with store.engine.connect() as conn:
            return len(conn.execute(text).fetchall())

    return _timed(run, reps)


async def _api_latency(store, run: str, reps: int) -> dict:
    import aiohttp

    from steptail.serve import PAGE_MAX, serve

    urls: list[str] = []
    stop = asyncio.Event()
    task = asyncio.create_task(serve(store, "127.0.0.1", 0, None, started=urls.append, stop=stop))
    while not urls:
        await asyncio.sleep(0.01)
    out = {}
    try:
        async with aiohttp.ClientSession(urls[0], timeout=aiohttp.ClientTimeout(total=300)) as http:
            async def walk(limit: int, pages: int | None = None) -> int:
                path, n, seen = f"/api/runs/{run}/steps?limit={limit}", 0, 0
                while path and (pages is None or seen < pages):
                    async with http.get(path) as resp:
                        page = await resp.json()
                    n += page["count"]
                    path, seen = page["next"], seen + 1
                return n

            for name, limit, pages in (("first_page_1000", 1000, 1), ("all_pages_1000", 1000, None),
                                       (f"all_pages_{PAGE_MAX}", PAGE_MAX, None)):
                await walk(limit, pages)  # warm-up
                times, rows = [], 0
                for _ in range(reps):
                    t = time.perf_counter()
                    rows = await walk(limit, pages)
                    times.append((time.perf_counter() - t) * 1000)
                out[name] = {"median_ms": round(statistics.median(times), 2),
                             "max_ms": round(max(times), 2), "rows": rows, "reps": reps}
    finally:
        stop.set()
        await task
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    with scratch_database(PG_ADMIN, "steptail_bench") as url:
        store = open_store(url)
        try:
            t = time.perf_counter()
            _load(store, args.runs, args.steps)
            load_s = time.perf_counter() - t
            one, five = ["run-000"], [f"run-{r:03d}" for r in range(min(5, args.runs))]
            result = {
                "runs": args.runs, "steps_per_run": args.steps, "loss_parts_rows": args.runs * args.steps,
                "load_seconds": round(load_s, 1),
                "ce_by_step_1_run": _sql_latency(store, q.CE_BY_STEP, one, args.steps, args.reps),
                "ce_by_step_5_runs": _sql_latency(store, q.CE_BY_STEP, five, args.steps, args.reps),
                "ce_over_time_1_run": _sql_latency(store, q.CE_OVER_TIME, one, args.steps, args.reps),
                "fleet_table": _sql_latency(store, q.FLEET, one, args.steps, args.reps),
                "alert_missing_steps": _sql_latency(store, q.ALERT_MISSING_STEPS, one, args.steps, args.reps),
                "api_steps_run_000": asyncio.run(_api_latency(store, "run-000", args.reps)),
            }
        finally:
            store.dispose()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
