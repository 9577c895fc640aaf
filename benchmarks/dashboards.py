"""Latency of the dashboards' panel and alert queries on PostgreSQL as the store's history
grows (runs of 20k steps each, a few of them live, the rest finished long ago), before and
after a change in one run, and of GET /api/runs/{run}/steps for one 20k-step run.

    .venv/bin/python benchmarks/dashboards.py --json [--runs 100,1000,3000] [--steps 20000]
        [--live 20] [--before REV]

Loads a scratch database (unique name, dropped afterwards) with COPY, growing it to each size
in turn, and at each size times every query `--reps` times after one warm-up: median and max
in milliseconds. `--before REV` also times the queries as they were at git revision REV (its
dashboards/queries.py) on the same data, with the indexes that revision had: each query at both
revisions in turn, rep by rep, so that both columns see the same load."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import types
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from steptail.dashboards import queries as q  # noqa: E402
from steptail.dashboards.macros import Context, TimeRange, Variable, expand  # noqa: E402
from steptail.storage.db import open_store  # noqa: E402
from steptail.storage.scratch import scratch_database  # noqa: E402

PG_ADMIN = os.environ.get("STEPTAIL_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
STEP_NS = 12 * 10**9
LAYERS = 16
HISTORY_NS = 30 * 86_400 * 10**9  # finished runs ended a month before the live ones
# Every panel and alert query the benchmark times, by the name of its constant in queries.py.
QUERIES = ("CE_BY_STEP", "CE_OVER_TIME", "RBF_MAX_BY_STEP", "FLEET", "GOODPUT", "ALERT_MISSING_STEPS",
           "ALERT_STALL", "ALERT_STEP1_GATE", "ALERT_DIVERGENCE")


def _load(store, first: int, last: int, steps: int, live: int, t_end: int) -> None:
    """Runs first..last-1 of `steps` steps each: the first `live` end at t_end, the others a
    month before (history). Fills loss_summary and loss_rollup as the migration does for rows
it finds (the same numbers the sink keeps at commit), and one run_goodput row per run."""
    raw = store.engine.raw_connection()
    try:
        cur = raw.cursor()
        names = [f"run-{r:05d}" for r in range(first, last)]
        with cur.copy("COPY runs (run, jobset, namespace, created_ns, updated_ns) FROM STDIN") as cp:
            for r, run in zip(range(first, last), names, strict=True):  # last written at its last step
                t0 = _t0(r, steps, live, t_end)
                cp.write_row((run, f"js-{run}", "bench", t0, t0 + steps * STEP_NS))
        with cur.copy("COPY incarnations (run, incarnation, started_ns, saw_start, first_step,"
                      " last_step) FROM STDIN") as cp:
            for r, run in zip(range(first, last), names, strict=True):
                cp.write_row((run, 1, _t0(r, steps, live, t_end), True, 1, steps))
        with cur.copy("COPY loss_parts (run, incarnation, step, ts_ns, ce, ce_raw, parts)"
                      " FROM STDIN") as cp:
            for r, run in zip(range(first, last), names, strict=True):
                t0 = _t0(r, steps, live, t_end)
                for s in range(1, steps + 1):
                    ce = 4.0 - 2.0 * s / steps + (r % 7) * 0.01
                    cp.write_row((run, 1, s, t0 + s * STEP_NS, ce, f"{ce:.6f}",
                                  '{"z_loss":0.0001,"moe_lb":0.0124,"weights":1048576}'))
        if first == 0:  # the run served by the API and the RBF panel has the probe
            t0 = _t0(0, steps, live, t_end)
            with cur.copy("COPY required_rbf (run, incarnation, step, ts_ns, max, per_layer, program)"
                          " FROM STDIN") as cp:
                for s in range(1, steps + 1):
                    layers = [1.0 + ((s * 7 + k * 13) % 100) / 40 for k in range(LAYERS)]
                    cp.write_row(("run-00000", 1, s, t0 + s * STEP_NS + 1000, max(layers),
                                  json.dumps(layers), "first_phase"))
        cur.execute("INSERT INTO loss_summary (run, incarnation, steps, lo, hi, first_ts_ns, last_ts_ns)"
                    " SELECT run, incarnation, COUNT(*), MIN(step), MAX(step), MIN(ts_ns), MAX(ts_ns)"
                    " FROM loss_parts WHERE run >= %s AND run <= %s GROUP BY run, incarnation",
                    (names[0], names[-1]))
        cur.execute("INSERT INTO loss_rollup (run, incarnation, block, steps, s0, s1, ce_lo, ce_hi, nan_step)"
                    " SELECT run, incarnation, step / 16, COUNT(*), MIN(step), MAX(step), MIN(ce), MAX(ce),"
                    " MIN(CASE WHEN ce IS NULL THEN step END) FROM loss_parts WHERE run >= %s AND run <= %s"
                    " GROUP BY run, incarnation, step / 16", (names[0], names[-1]))
        # run_goodput as a commit keeps it (storage.goodput): one row per run; its figures are
        # the steps' times, the panel reads them as they are
        cur.execute("INSERT INTO run_goodput (run, wall_s, productive_s, replayed_s, recovery_s, checkpoint_s,"
                    " other_s, goodput, median_step_s, report, updated_ns)"
                    " SELECT run, (MAX(last_ts_ns) - MIN(first_ts_ns)) / 1e9, SUM(steps) * %s, 0, 0, 0, 0, 1, %s,"
                    " '{}', MAX(last_ts_ns) FROM loss_summary WHERE run >= %s AND run <= %s GROUP BY run",
                    (STEP_NS / 1e9, STEP_NS / 1e9, names[0], names[-1]))
        raw.commit()
        cur.execute("ANALYZE")
        raw.commit()
    finally:
        raw.close()


def _t0(r: int, steps: int, live: int, t_end: int) -> int:
    return t_end - steps * STEP_NS - (0 if r < live else HISTORY_NS)


def _timed(fns: dict, reps: int) -> dict:
    """Each of `fns` (by version) timed `reps` times after one warm-up (plan cache, buffers),
    alternated: one rep of each in turn, the order reversed every other rep. The objects this
    process already holds are frozen first: otherwise a full collection over them (~40 ms) lands
    in one rep in seven or so, a cost of this benchmark's heap, not of the query."""
    for fn in fns.values():
        fn()
    gc.collect()
    gc.freeze()
    names = list(fns)
    times: dict = {name: [] for name in names}
    rows: dict = {}
    for i in range(reps):
        for name in names if i % 2 == 0 else names[::-1]:
            t = time.perf_counter()
            rows[name] = fns[name]()
            times[name].append((time.perf_counter() - t) * 1000)
    return {name: {"median_ms": round(statistics.median(times[name]), 2),
                   "max_ms": round(max(times[name]), 2), "rows": rows[name], "reps": reps}
            for name in names}


def _context(runs: list[str], start_ns: int, end_ns: int) -> Context:
    return Context(
        TimeRange(datetime.fromtimestamp(start_ns / 1e9, UTC), datetime.fromtimestamp(end_ns / 1e9, UTC)),
        {"run": Variable(runs, multi=True),
         "namespace": Variable(["bench"], multi=True, include_all=True),
         "points": Variable([str(getattr(q, "POINTS_DEFAULT", 1000))])})


def _sql_latency(store, sqls: dict[str, str], ctx: Context, reps: int) -> dict:
    """{version: timing} of one query's text at each version."""

    def runner(sql: str):
        text = sa.text(expand(sql, ctx).replace(":", r"\:"))

        def run() -> int:
            with store.engine.connect() as conn:
                return len(conn.execute(text).fetchall())

        return run

    return _timed({version: runner(sql) for version, sql in sqls.items()}, reps)


def _queries_at(rev: str) -> types.ModuleType:
    """dashboards/queries.py as it was at `rev`, as a module."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:dashboards/queries.py"],
                            check=True, capture_output=True, text=True).stdout
    module = types.ModuleType(f"queries_{rev}")
    exec(compile(source, f"{rev}:dashboards/queries.py", "exec"), module.__dict__)  # our own code
    return module


def _panels_and_alerts(store, versions: dict, steps: int, live: int, t_end: int, reps: int) -> dict:
    """Each query of QUERIES as a user meets it, at each of `versions` ({name: queries
    module}): panels over the live run's whole span, the alerts over their 6 h window ending
    at the live runs' last step. {version: {query: timing}}."""
    one, five = ["run-00000"], [f"run-{r:05d}" for r in range(min(5, live))]
    span = _context(one, t_end - (steps + 1) * STEP_NS, t_end)
    out: dict = {version: {} for version in versions}
    for name in QUERIES:
        sqls = {version: getattr(queries, name) for version, queries in versions.items() if hasattr(queries, name)}
        if name in ("CE_BY_STEP", "CE_OVER_TIME"):
            timed = {f"{name}_1_run": _sql_latency(store, sqls, span, reps),
                     f"{name}_5_runs": _sql_latency(store, sqls, _context(five, span.time.start_ns, t_end), reps)}
        elif name.startswith("ALERT_"):
            window = _context(one, t_end - q.ALERT_WINDOW_S * 10**9, t_end + 60 * 10**9)
            timed = {name: _sql_latency(store, sqls, window, reps)}
        else:
            timed = {name: _sql_latency(store, sqls, span, reps)}
        for key, by_version in timed.items():
            for version, timing in by_version.items():
                out[version][key] = timing
    return out


async def _api_latency(store, run: str, reps: int) -> dict:
    import aiohttp

    from steptail.http.routes.steps import PAGE_MAX
    from steptail.http.server import serve

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
    ap.add_argument("--runs", default="100,1000,3000", help="store sizes to grow through, in runs")
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--live", type=int, default=20, help="runs with a step in the last 6 h")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--before", metavar="REV", help="also time the queries of this git revision")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = sorted(int(n) for n in args.runs.split(","))
    before = _queries_at(args.before) if args.before else None
    old_indexes = before is not None and not _has_summary(args.before)
    t_end = (time.time_ns() // 10**9) * 10**9
    result = {"steps_per_run": args.steps, "live_runs": args.live, "before": args.before, "sizes": []}
    with scratch_database(PG_ADMIN, "steptail_bench") as url:
        store = open_store(url)
        try:
            loaded = 0
            for size in sizes:
                t = time.perf_counter()
                _load(store, loaded, size, args.steps, args.live, t_end)
                loaded = size
                point = {"runs": size, "loss_parts_rows": size * args.steps,
                         "load_seconds": round(time.perf_counter() - t, 1)}
                versions = {"after": q} if before is None else {"after": q, "before": before}
                with _old_indexes(store) if old_indexes else contextlib.nullcontext():
                    point.update(_panels_and_alerts(store, versions, args.steps, args.live, t_end, args.reps))
                print(f"{size} runs: loaded in {point['load_seconds']} s", file=sys.stderr)
                result["sizes"].append(point)
            result["api_steps_run_00000"] = asyncio.run(_api_latency(store, "run-00000", args.reps))
        finally:
            store.dispose()
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for point in result["sizes"]:
        for name, after in point["after"].items():
            was = point.get("before", {}).get(name)
            print(f"{point['runs']:>6} runs  {name:<22} {after['median_ms']:>9} ms"
                  + (f"  (before {was['median_ms']} ms)" if was else ""))
    print("api:", result["api_steps_run_00000"])


def _has_summary(rev: str) -> bool:
    """Whether `rev` has migration 0009 (loss_summary; ix_loss_parts_ts dropped)."""
    return subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e",
                           f"{rev}:storage/migrations/versions/0009_loss_summary.py"],
                          capture_output=True).returncode == 0


class _old_indexes:
    """The index the queries before 0009 read (ix_loss_parts_ts), while timing a revision
    without it (both revisions are timed in turn: the newer one sees it too)."""

    def __init__(self, store) -> None:
        self.store = store

    def __enter__(self) -> None:
        with self.store.engine.begin() as conn:
            conn.execute(sa.text("CREATE INDEX IF NOT EXISTS ix_loss_parts_ts ON loss_parts (ts_ns)"))
            conn.execute(sa.text("ANALYZE loss_parts"))

    def __exit__(self, *exc) -> None:
        with self.store.engine.begin() as conn:
            conn.execute(sa.text("DROP INDEX IF EXISTS ix_loss_parts_ts"))


if __name__ == "__main__":
    main()
