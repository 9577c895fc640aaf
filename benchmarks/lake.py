"""The lake (storage.lake, Iceberg tables) on a local folder, moto's S3 server and
fake-gcs-server: append speed, the live writer's commits per minute, read time before and
after compaction, and how the object count grows.

    .venv/bin/python benchmarks/lake.py --quick            # about 2 minutes (more on a busy machine)
    .venv/bin/python benchmarks/lake.py --json             # the full run, under 10 minutes
    .venv/bin/python benchmarks/lake.py --only writer --writer-seconds 120 --every 30,5,1
    .venv/bin/python benchmarks/lake.py --only fleet --periods 200 --checkpoints 50,100,200

Sections (--only picks some):

append  Lake.append of batches of loss_parts rows (--sizes rows, spread over --append-runs
        runs: one data file per run and commit) into a fresh table on each backend: one
        warm-up commit (the table created), then the median of --commits commits.
writer  collector.live.lake_feed.LakeWriter with a real Store (a SQLite file, the catalog in
        it) fed by --writer-runs runs of --rate loss_parts rows per second each for
        --writer-seconds (at least two periods), written whenever writer.due() (on a task:
        the rows keep coming while a write runs, as in follow), for each --every. Commits per minute, rows written (checked
        against the table afterwards), lag (age of the oldest row a write takes, when it
        starts and when its commit has landed), CPU seconds of this process (and of the
        driving loop alone, the main thread) and of the emulator's process.
fleet   --runs runs appended for --periods commit periods (each period: that period's rows of
        every run to loss_parts and to required_rbf, --steps / --periods steps per run: one
        commit per table, as the writer does), objects under the warehouse counted by kind at
        each of --checkpoints and extrapolated to a day of --day-every-second periods (an
        extrapolation: the figures measured are the ones at the checkpoints). Then reads (one
        run, all runs; Lake.read and pyiceberg's scan().to_duckdb), Lake.compact of every
        run's tables, the objects compaction added, live data files (those the current snapshot
        refers to) before and after, and the reads again. Nothing is ever deleted (the FileIO
        deletes nothing, snapshots never expire): the object count only grows.

Every server binds 127.0.0.1 and is stopped at exit; the scratch folder (stores, local
warehouses, the GCS emulator's files) is a temporary directory removed at exit. The process
environment keeps SDKs away from cloud metadata servers (AWS_EC2_METADATA_DISABLED,
GCE_METADATA_HOST on a closed loopback port); the emulators get explicit endpoints and keys."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import posixpath
import resource
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from object_store_support import METADATA_BLOCKING_ENV, running_fake_gcs, running_moto_s3  # noqa: E402

from steptail.collector.live.lake_feed import LakeWriter  # noqa: E402
from steptail.runs.model import Batch  # noqa: E402
from steptail.storage.db import open_store  # noqa: E402
from steptail.storage.lake import Lake, as_lake_rows  # noqa: E402
from steptail.storage.object_store import list_objects  # noqa: E402
from steptail.storage.parquet import to_arrow  # noqa: E402

BACKENDS = ("file", "s3", "gs")
T0_NS = 1_700_000_000_000_000_000
LAYERS = 16
SECONDS_PER_DAY = 86_400
SLOW_READ_S = 5.0  # a read this slow is timed once, not --read-reps times
# --quick and the full run: what each option is when not given.
PROFILES = {
    "full": {"sizes": "1000,10000", "append_runs": "1,32", "commits": 5, "append_backends": "file,s3,gs",
             "writer_seconds": 20.0, "every": "30,5", "writer_backends": "file,s3", "writer_runs": 200,
             "rate": 5.0, "runs": 32, "periods": 100, "steps": 20_000, "checkpoints": "25,50,100",
             "read_reps": 3},
    "quick": {"sizes": "1000,10000", "append_runs": "1,32", "commits": 2, "append_backends": "file,s3,gs",
              "writer_seconds": 15.0, "every": "5", "writer_backends": "file,s3", "writer_runs": 200,
              "rate": 5.0, "runs": 16, "periods": 20, "steps": 2_000, "checkpoints": "10,20",
              "read_reps": 1},
}


# --- rows


def loss_rows(run: str, lo: int, hi: int, ts_ns: int | None = None) -> list[tuple]:
    """loss_parts Batch rows of `run` for steps lo..hi-1 (ts at each step, or all at ts_ns)."""
    return [(run, 1, s, ts_ns or T0_NS + s * 10**9, 4.0 - s / 10**5, None,
             f'{{"ce":{4.0 - s / 10**5},"z_loss":0.0001,"moe_lb":0.0124}}') for s in range(lo, hi)]


def rbf_rows(run: str, lo: int, hi: int) -> list[tuple]:
    out = []
    for s in range(lo, hi):
        layers = [1.0 + ((s * 7 + k * 13) % 100) / 40 for k in range(LAYERS)]
        out.append((run, 1, s, T0_NS + s * 10**9 + 1000, max(layers), json.dumps(layers, separators=(",", ":")), "first_phase"))
    return out


def lake_batch(table: str, by_run: dict[str, list[tuple]]):
    return {run: as_lake_rows(table, run, to_arrow(table, rows)) for run, rows in by_run.items()}


# --- backends


class Backends:
    """The local folder and the emulators, each started on first use and kept to the end."""

    def __init__(self, work: Path, stack: contextlib.ExitStack) -> None:
        self.work, self.stack = work, stack
        self.servers: dict = {}

    def server(self, kind: str):
        if kind not in self.servers:
            folder = self.work / f"{kind}-server"
            folder.mkdir()
            start = running_moto_s3 if kind == "s3" else running_fake_gcs
            t0 = time.perf_counter()
            self.servers[kind] = self.stack.enter_context(start(folder, dict(METADATA_BLOCKING_ENV)))
            print(f"[lake bench] {kind} emulator up in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        return self.servers[kind]

    def lake(self, kind: str, name: str, writer: str | None = None):
        """A fresh store (SQLite file, the catalog in it) and a Lake at a fresh location."""
        tag = f"{name}-{uuid.uuid4().hex[:8]}"
        store = open_store(f"sqlite:///{self.work / (tag + '.db')}")
        if kind == "file":
            target, env = f"file://{self.work / tag}", dict(os.environ)
        else:
            server = self.server(kind)
            target, env = server.url(tag), server.env
        return store, Lake(target, store.catalog_url(), env=env, writer=writer)

    def server_cpu(self, kind: str) -> float:
        if kind == "file":
            return 0.0
        times = psutil.Process(self.servers[kind].process.pid).cpu_times()
        return times.user + times.system


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# --- 1. append


def bench_append(backends: Backends, kinds: list[str], sizes: list[int], runs_list: list[int],
                 commits: int) -> list[dict]:
    out = []
    for kind in kinds:
        for nruns in runs_list:
            for size in sizes:
                per = max(1, size // nruns)
                store, lake = backends.lake(kind, f"append-{nruns}x{size}")
                names = [f"run-{r:03d}" for r in range(nruns)]
                ms, first = [], None
                load0 = load()
                for i in range(commits + 1):
                    batch = lake_batch("loss_parts", {r: loss_rows(r, 1 + i * per, 1 + (i + 1) * per) for r in names})
                    t0 = time.perf_counter()
                    added = lake.append("loss_parts", batch)
                    dt = time.perf_counter() - t0
                    if added != per * nruns:
                        raise SystemExit(f"append on {kind}: {added} rows added of {per * nruns}")
                    if i == 0:
                        first = dt  # the table created, the catalog opened
                    else:
                        ms.append(dt * 1000)
                store.dispose()
                med = median(ms)
                out.append({"backend": kind, "runs_per_commit": nruns, "rows_per_commit": per * nruns,
                            "commits": commits, "median_ms": round(med, 1), "max_ms": round(max(ms), 1),
                            "first_commit_ms": round(first * 1000, 1),
                            "rows_per_s": round(per * nruns / (med / 1000)), "load_avg": load0})
                print(f"[lake bench] append {kind} {nruns} runs x {per} rows: {med:.0f} ms", file=sys.stderr)
    return out


# --- 2. the live writer


async def drive(writer: LakeWriter, nruns: int, rate: float, seconds: float) -> dict:
    """`nruns` runs adding `rate` rows/s each for `seconds`; a write whenever due."""
    names = [f"live-{r:03d}" for r in range(nruns)]
    tick = 1.0 / rate
    start = time.monotonic()
    writer.last = start
    k, added, task, writes_started = 0, 0, None, 0
    while True:
        elapsed = time.monotonic() - start
        if elapsed > seconds + tick / 2:  # a write due at exactly `seconds` still starts
            break
        target = int(elapsed / tick) + 1
        while k < target:
            k += 1
            ts = time.time_ns()
            for run in names:
                writer.add(run, Batch(loss_parts=loss_rows(run, k, k + 1, ts)))
            added += nruns
        if writer.due() and (task is None or task.done()):
            task = asyncio.create_task(writer.write())
            writes_started += 1
        await asyncio.sleep(max(0.0, start + k * tick - time.monotonic()))
    window = time.monotonic() - start
    if task is not None:
        await task
    return {"added": added, "window_s": window, "writes_started": writes_started}


def bench_writer(backends: Backends, kind: str, every: float, nruns: int, rate: float, seconds: float) -> dict:
    store, lake = backends.lake(kind, f"writer-{every:g}s")
    lake.table("loss_parts")  # the catalog opened and the table made before the clock starts
    writer = LakeWriter(store, lake, every)
    writes: list[dict] = []
    inner = writer._write

    def timed(rows, snapshots):  # on the write's thread
        firsts = [v[0][3] for by_run in rows.values() for v in by_run.values() if v]
        n = sum(len(v) for by_run in rows.values() for v in by_run.values())
        began = time.time_ns()
        t0 = time.perf_counter()
        inner(rows, snapshots)
        oldest = min(firsts) if firsts else began
        writes.append({"rows": n, "seconds": time.perf_counter() - t0, "lag_at_start_s": (began - oldest) / 1e9,
                       "lag_landed_s": (time.time_ns() - oldest) / 1e9})

    writer._write = timed
    load0 = load()
    cpu0, main0, server0 = cpu_seconds(), time.thread_time(), backends.server_cpu(kind)
    result = asyncio.run(drive(writer, nruns, rate, seconds))
    cpu, main, server = cpu_seconds() - cpu0, time.thread_time() - main0, backends.server_cpu(kind) - server0
    commits_window = lake.commits
    in_window = list(writes)
    asyncio.run(writer.write(now=True))  # shutdown's last write: not in the rates
    held = lake.read("loss_parts", columns=["run"]).num_rows
    store.dispose()
    if held != result["added"] or writer.failed:
        print(f"[lake bench] writer on {kind}: {held} rows in the table of {result['added']} added;"
              f" failures: {writer.failed}", file=sys.stderr)
    minutes = result["window_s"] / 60
    lags = [w["lag_at_start_s"] for w in in_window] or [float("nan")]
    landed = [w["lag_landed_s"] for w in in_window] or [float("nan")]
    write_s = [w["seconds"] for w in in_window] or [float("nan")]
    return {
        "backend": kind, "every_s": every, "runs": nruns, "rows_per_s_per_run": rate,
        "seconds": round(result["window_s"], 1), "commits": commits_window,
        "commits_per_minute": round(commits_window / minutes, 2),
        "rows_added": result["added"], "rows_in_table_after_last_write": held,
        "rows_written_in_window": sum(w["rows"] for w in in_window),
        "writes": len(in_window), "write_s_median": round(median(write_s), 3), "write_s_max": round(max(write_s), 3),
        "lag_at_write_s_max": round(max(lags), 2), "lag_landed_s_max": round(max(landed), 2),
        "lag_landed_s_median": round(median(landed), 2),
        "cpu_s": round(cpu, 2), "cpu_s_driving_loop": round(main, 2), "cpu_s_writer": round(cpu - main, 2),
        "cpu_share_of_one_core": round(cpu / result["window_s"], 3),
        "emulator_cpu_s": round(server, 2) if kind != "file" else None,
        "failures": dict(writer.failed), "load_avg": load0,
    }


# --- 3 and 4. a fleet's table: objects, reads, compaction


def count_objects(lake: Lake) -> dict:
    objs = list_objects(lake.location, lake.props)
    kinds = {"data_parquet": 0, "manifests_avro": 0, "manifest_lists_avro": 0, "metadata_json": 0, "other": 0}
    meta_bytes = 0
    for uri, size in objs:
        base = posixpath.basename(uri)
        if base.endswith(".parquet"):
            kinds["data_parquet"] += 1
        elif base.endswith(".avro"):
            kinds["manifest_lists_avro" if base.startswith("snap-") else "manifests_avro"] += 1
        elif base.endswith(".metadata.json"):
            kinds["metadata_json"] += 1
            meta_bytes += size
        else:
            kinds["other"] += 1
    sizes = dict(objs)
    current = {}
    for name in ("loss_parts", "required_rbf"):
        tbl = lake.table(name, create=False)
        tbl.refresh()
        current[name] = sizes.get(tbl.metadata_location)
    return {"objects": len(objs), "bytes": sum(s for _, s in objs), **kinds, "metadata_json_bytes_all": meta_bytes,
            "current_metadata_json_bytes": current}


def live_files(lake: Lake) -> dict:
    out = {}
    for name in ("loss_parts", "required_rbf"):
        tbl = lake.table(name, create=False)
        tbl.refresh()
        out[name] = len(list(tbl.scan().plan_files()))
    return out


def time_reads(lake: Lake, run: str, reps: int) -> dict:
    import duckdb
    from pyiceberg.expressions import EqualTo

    def timed(fn) -> tuple[float, int]:
        ts, n = [], 0
        for _ in range(reps):
            t0 = time.perf_counter()
            n = fn()
            ts.append(time.perf_counter() - t0)
            if ts[-1] > SLOW_READ_S:  # once is enough (and the full run stays short)
                break
        return round(median(ts), 3), n

    tbl = lake.table("loss_parts", create=False)

    def duck(row_filter=None) -> int:
        con = duckdb.connect()
        try:
            tbl.refresh()
            scan = tbl.scan(row_filter=row_filter) if row_filter is not None else tbl.scan()
            scan.to_duckdb("loss", connection=con)
            return con.execute("SELECT COUNT(*) FROM (SELECT run, step, ce FROM loss ORDER BY run, step)").fetchone()[0]
        finally:
            con.close()

    one_s, one_n = timed(lambda: lake.read("loss_parts", run).num_rows)
    all_s, all_n = timed(lambda: lake.read("loss_parts").num_rows)
    cols_s, _ = timed(lambda: lake.read("loss_parts", columns=["run", "step", "ce"]).num_rows)
    plan_s, files = timed(lambda: len(list(tbl.scan().plan_files())))
    duck_one_s, _ = timed(lambda: duck(EqualTo("run", run)))
    duck_all_s, _ = timed(lambda: duck())
    return {"one_run_s": one_s, "one_run_rows": one_n, "all_runs_s": all_s, "all_runs_rows": all_n,
            "all_runs_3_columns_s": cols_s, "plan_files_s": plan_s, "live_files": files,
            "duckdb_one_run_s": duck_one_s, "duckdb_all_runs_s": duck_all_s}


def bench_fleet(backends: Backends, kind: str, nruns: int, periods: int, steps: int, checkpoints: list[int],
                day_every: float, reps: int) -> dict:
    store, lake = backends.lake(kind, "fleet")
    names = [f"run-{r:03d}" for r in range(nruns)]
    per = max(1, steps // periods)
    points, commit_ms = [], {"loss_parts": [], "required_rbf": []}
    load0 = load()
    t_fill = time.perf_counter()
    for p in range(periods):
        lo, hi = 1 + p * per, 1 + (p + 1) * per
        for table, make in (("loss_parts", loss_rows), ("required_rbf", rbf_rows)):
            batch = lake_batch(table, {r: make(r, lo, hi) for r in names})
            t0 = time.perf_counter()
            lake.append(table, batch)
            commit_ms[table].append((time.perf_counter() - t0) * 1000)
        if p + 1 in checkpoints:
            point = {"periods": p + 1, **count_objects(lake),
                     "commit_ms_median_last_10": {t: round(median(v[-10:]), 1) for t, v in commit_ms.items()}}
            points.append(point)
            print(f"[lake bench] fleet {p + 1} periods: {point['objects']} objects", file=sys.stderr)
    fill_s = time.perf_counter() - t_fill
    day = SECONDS_PER_DAY / day_every
    extrapolated = extrapolate(points, day) if len(points) >= 2 else None
    live_before = live_files(lake)
    reads_before = time_reads(lake, names[0], reps)
    before = points[-1] if points and points[-1]["periods"] == periods else {"periods": periods, **count_objects(lake)}
    t0 = time.perf_counter()
    compacted = {t: [lake.compact(t, r) for r in names] for t in ("loss_parts", "required_rbf")}
    compact_s = time.perf_counter() - t0
    after = count_objects(lake)
    live_after = live_files(lake)
    reads_after = time_reads(lake, names[0], reps)
    store.dispose()
    return {
        "backend": kind, "runs": nruns, "periods": periods, "steps_per_run": per * periods,
        "rows_per_run_per_period": per, "fill_s": round(fill_s, 1), "load_avg": load0,
        "growth": points, "day_periods": day, "day_every_s": day_every, "extrapolated_day": extrapolated,
        "before_compaction": before, "live_data_files_before": live_before, "reads_before": reads_before,
        "compaction_s": round(compact_s, 1),
        "compactions_done": {t: sum(1 for b, a in v if b > a) for t, v in compacted.items()},
        "after_compaction": after, "objects_added_by_compaction": after["objects"] - before["objects"],
        "objects_added_by_compaction_by_kind": {k: after[k] - before[k] for k in
                                                ("data_parquet", "manifests_avro", "manifest_lists_avro",
                                                 "metadata_json")},
        "live_data_files_after": live_after, "reads_after": reads_after, "load_avg_end": load(),
    }


def extrapolate(points: list[dict], day: float) -> dict:
    """A straight line through the last two checkpoints for object counts and the current
    metadata.json's size; the bytes of every metadata.json written then sum that line."""
    a, b = points[-2], points[-1]
    span = b["periods"] - a["periods"]
    out = {"from_periods": [a["periods"], b["periods"]]}
    for k in ("objects", "data_parquet", "manifests_avro", "manifest_lists_avro", "metadata_json", "bytes"):
        slope = (b[k] - a[k]) / span
        out[f"{k}_per_period"] = round(slope, 2)
        out[k] = round(b[k] + slope * (day - b["periods"]))
    out["current_metadata_json_bytes"] = {}
    meta_total = b["metadata_json_bytes_all"]
    for t, size in b["current_metadata_json_bytes"].items():
        slope = (size - a["current_metadata_json_bytes"][t]) / span
        out["current_metadata_json_bytes"][t] = round(size + slope * (day - b["periods"]))
        # each later period writes one metadata.json of this table, growing by `slope`
        n = day - b["periods"]
        meta_total += n * size + slope * n * (n + 1) / 2
    out["metadata_json_bytes_all"] = round(meta_total)
    return out


# --- output


def table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def human(report: dict) -> str:
    out = [f"cpus {report['cpus']}  load avg at start {report['load_avg_start']}  at end {report['load_avg_end']}"
           f"  pyiceberg {report['pyiceberg']}  total {report['total_s']} s {report['section_s']}"]
    if "append" in report:
        out += ["", "1. Lake.append of loss_parts rows (median of commits after a warm-up one)", table(
            ["backend", "runs/commit", "rows/commit", "median ms", "max ms", "first ms", "rows/s", "load avg"],
            [[a["backend"], a["runs_per_commit"], a["rows_per_commit"], a["median_ms"], a["max_ms"],
              a["first_commit_ms"], a["rows_per_s"], a["load_avg"][0]] for a in report["append"]])]
    if "writer" in report:
        out += ["", "2. LakeWriter: runs x rows/s each, commits per minute per replica", table(
            ["backend", "every s", "runs", "seconds", "commits", "commits/min", "rows added", "rows in window",
             "write s med", "write s max", "lag@write max s", "lag landed max s", "cpu s", "writer cpu s",
             "emulator cpu s", "load avg"],
            [[w["backend"], w["every_s"], w["runs"], w["seconds"], w["commits"], w["commits_per_minute"],
              w["rows_added"], w["rows_written_in_window"], w["write_s_median"], w["write_s_max"],
              w["lag_at_write_s_max"], w["lag_landed_s_max"], w["cpu_s"], w["cpu_s_writer"], w["emulator_cpu_s"],
              w["load_avg"][0]] for w in report["writer"]])]
        bad = [w for w in report["writer"] if w["failures"] or w["rows_in_table_after_last_write"] != w["rows_added"]]
        for w in bad:
            out.append(f"  !! {w['backend']} every {w['every_s']}: {w['rows_in_table_after_last_write']} rows in the"
                       f" table of {w['rows_added']}; failures {w['failures']}")
    if "fleet" in report:
        f = report["fleet"]
        out += ["", f"3/4. fleet on {f['backend']}: {f['runs']} runs, {f['periods']} periods of"
                    f" {f['rows_per_run_per_period']} rows per run into loss_parts and required_rbf"
                    f" (filled in {f['fill_s']} s)"]
        rows = [[p["periods"], p["objects"], p["data_parquet"], p["manifests_avro"], p["manifest_lists_avro"],
                 p["metadata_json"], round(p["bytes"] / 2**20, 1),
                 p["current_metadata_json_bytes"]["loss_parts"], round(p["metadata_json_bytes_all"] / 2**20, 2),
                 p["commit_ms_median_last_10"]["loss_parts"]] for p in f["growth"]]
        if f["extrapolated_day"]:
            e = f["extrapolated_day"]
            rows.append([f"{f['day_periods']:g} (extrapolated)", e["objects"], e["data_parquet"], e["manifests_avro"],
                         e["manifest_lists_avro"], e["metadata_json"], round(e["bytes"] / 2**20, 1),
                         e["current_metadata_json_bytes"]["loss_parts"],
                         round(e["metadata_json_bytes_all"] / 2**20, 1), ""])
        out.append(table(["periods", "objects", "data .parquet", "manifests", "manifest lists", "metadata .json",
                          "MiB", "loss_parts metadata.json B", "all metadata.json MiB", "commit ms (last 10)"], rows))
        if f["extrapolated_day"]:
            out.append(f"  a day = {f['day_periods']:g} periods of {f['day_every_s']:g} s: a straight line through the"
                       f" checkpoints {f['extrapolated_day']['from_periods']}, not measured")
        out.append(f"  compaction of every run's two tables: {f['compaction_s']} s, {f['objects_added_by_compaction']}"
                   f" objects added ({f['objects_added_by_compaction_by_kind']}); nothing is deleted, so objects"
                   f" only grow: {f['before_compaction']['objects']} -> {f['after_compaction']['objects']}")
        out.append(f"  live data files (current snapshot): {f['live_data_files_before']} before,"
                   f" {f['live_data_files_after']} after")
        rb, ra = f["reads_before"], f["reads_after"]
        keys = ["one_run_s", "all_runs_s", "all_runs_3_columns_s", "plan_files_s", "duckdb_one_run_s",
                "duckdb_all_runs_s"]
        out.append(table(["read (loss_parts)", "before compaction s", "after s"],
                         [[k, rb[k], ra[k]] for k in keys]
                         + [["rows (one run / all)", f"{rb['one_run_rows']} / {rb['all_runs_rows']}",
                             f"{ra['one_run_rows']} / {ra['all_runs_rows']}"],
                            ["live files", rb["live_files"], ra["live_files"]]]))
    return "\n".join(out)


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def kinds(text: str) -> list[str]:
    out = [x.strip() for x in text.split(",") if x.strip()]
    for k in out:
        if k not in BACKENDS:
            raise SystemExit(f"unknown backend {k!r}: use {', '.join(BACKENDS)}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--quick", action="store_true", help="smaller sizes and shorter runs (about 2 minutes)")
    ap.add_argument("--only", default="append,writer,fleet", help="sections to run (default: all)")
    g = ap.add_argument_group("append")
    g.add_argument("--sizes", help="rows per commit (default 1000,10000)")
    g.add_argument("--append-runs", help="runs the rows of a commit are spread over (default 1,32)")
    g.add_argument("--commits", type=int, help="timed commits per size after the warm-up (default 5)")
    g.add_argument("--append-backends", help="of file,s3,gs (default all three)")
    g = ap.add_argument_group("writer")
    g.add_argument("--writer-seconds", type=float,
                   help="how long the runs are fed per --every, at least two periods (default 20: 60 s at every 30)")
    g.add_argument("--every", help="the writer's periods in seconds (default 30,5; follow's --parquet-every is 30)")
    g.add_argument("--writer-backends", help="of file,s3,gs (default file,s3)")
    g.add_argument("--writer-runs", type=int, help="runs followed (default 200)")
    g.add_argument("--rate", type=float, help="loss_parts rows per second per run (default 5)")
    g = ap.add_argument_group("fleet")
    g.add_argument("--runs", type=int, help="runs (default 32)")
    g.add_argument("--periods", type=int, help="commit periods simulated (default 100)")
    g.add_argument("--steps", type=int, help="steps per run over all periods (default 20000)")
    g.add_argument("--checkpoints", help="periods at which objects are counted (default 25,50,100)")
    g.add_argument("--fleet-backend", default="file", choices=BACKENDS)
    g.add_argument("--day-every", type=float, default=30.0, help="the period a day is extrapolated at (s)")
    g.add_argument("--read-reps", type=int,
                   help=f"reads per measure, the median taken; once if over {SLOW_READ_S:g} s (default 3)")
    args = ap.parse_args()
    for k, v in PROFILES["quick" if args.quick else "full"].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    sections = set(kinds_ := [s.strip() for s in args.only.split(",") if s.strip()])
    if not sections <= {"append", "writer", "fleet"}:
        raise SystemExit(f"--only takes append, writer, fleet; not {kinds_}")
    checkpoints = sorted({c for c in ints(args.checkpoints) if c <= args.periods} | {args.periods})

    # pyarrow's AWS and Google clients read the process environment, not the `env` given
    os.environ.update(METADATA_BLOCKING_ENV)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the servers stopped, the folder removed
    import pyiceberg

    report: dict = {"cpus": os.cpu_count(), "load_avg_start": load(), "pyiceberg": pyiceberg.__version__,
                    "quick": args.quick}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="steptail-lake-bench-") as tmp, contextlib.ExitStack() as stack:
        backends = Backends(Path(tmp), stack)
        report["section_s"] = took = {}
        if "append" in sections:
            t0 = time.perf_counter()
            report["append"] = bench_append(backends, kinds(args.append_backends), ints(args.sizes),
                                            ints(args.append_runs), args.commits)
            took["append"] = round(time.perf_counter() - t0, 1)
        if "writer" in sections:
            t0 = time.perf_counter()
            report["writer"] = []
            for kind in kinds(args.writer_backends):
                for every in [float(x) for x in args.every.split(",") if x.strip()]:
                    seconds = max(args.writer_seconds, 2 * every)
                    w = bench_writer(backends, kind, every, args.writer_runs, args.rate, seconds)
                    report["writer"].append(w)
                    print(f"[lake bench] writer {kind} every {every:g} s: {w['commits_per_minute']} commits/min",
                          file=sys.stderr)
            took["writer"] = round(time.perf_counter() - t0, 1)
        if "fleet" in sections:
            t0 = time.perf_counter()
            report["fleet"] = bench_fleet(backends, args.fleet_backend, args.runs, args.periods, args.steps,
                                          checkpoints, args.day_every, args.read_reps)
            took["fleet"] = round(time.perf_counter() - t0, 1)
        report["emulators"] = {k: {"deletes_seen": s.deletes()} for k, s in backends.servers.items()}
    report["load_avg_end"] = load()
    report["total_s"] = round(time.perf_counter() - t_start, 1)
    print(json.dumps(report, indent=2) if args.json else human(report))


if __name__ == "__main__":
    main()
