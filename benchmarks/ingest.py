"""Ingest speed and memory against grep, on one generated process-0 log of the samples' shape.

    python benchmarks/ingest.py --json [--size-mb 420] [--pg ADMIN_URL] [--baseline REV [--rounds 3]
                                [--candidate REV2]]

Generates (once, cached in benchmarks/.cache/) a --timestamps log with restarts, then in one
run times `grep -F -e LOSS-PARTS -e REQUIRED_RBF FILE` (output drained through a pipe, best
of 3, page cache warm) and `steptail ingest FILE --parquet DIR` into a fresh SQLite file (with
--pg, a fresh database on that PostgreSQL server, dropped after), and records ingest's peak
RSS on the full file and on a quarter of it (memory must not grow with file size).

On SQLite it also times a floor: the rows that ingest stored, already Python tuples, inserted
into a fresh store of the same schema in one transaction (sqlite3 executemany, one row a
statement and SqlSink's multi-row statements; no reading, parsing, detectors, summaries or
Parquet). No ingest into SQLite
can beat `grep_seconds / store_floor_seconds` (`ratio_grep_over_store_floor`).

--baseline REV: the same ingest by steptail as of git revision REV (its tree from `git archive`,
imported ahead of this checkout; the built C scan copied when REV's parsers/_steady.c is this
one, else REV's own built with -O2 as pyproject.toml builds it), in the same run: `--rounds` pairs, this checkout and REV in turn, each into a fresh store;
medians and `ratio_ingest_over_baseline` (this / REV: above 1, slower). --candidate REV2: REV2
in place of this checkout (one change's own cost, between two revisions of history)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from steptail.parsers import format_ns  # noqa: E402
from steptail.runs.rows import COLUMNS, STEP_TABLES  # noqa: E402
from steptail.simcluster.trainer import Trainer  # noqa: E402
from steptail.storage.db import open_store  # noqa: E402
from steptail.storage.scratch import scratch_database  # noqa: E402
from steptail.storage.sql import MAX_PARAMS, MULTI  # noqa: E402

CACHE = ROOT / "benchmarks" / ".cache"
STEPTAIL = str(Path(sys.executable).with_name("steptail"))
RESTART_EVERY = 40_000  # steps between simulated preemptions


def generate(path: Path, size_mb: int) -> None:
    """Write a log of about size_mb MB: start-up, steps, preemption and restore, repeated."""
    target = size_mb << 20
    trainer = Trainer(steps=10**9, seed=7, checkpoint_period=1000, step_seconds=10.0)
    tmp = path.with_suffix(".tmp")
    written, step, incarnation, restore = 0, 0, 1, None
    clock = trainer.start_time
    with open(tmp, "w", encoding="utf-8", newline="\n") as out:

        def emit(lines: list[str]) -> None:
            nonlocal written, clock
            base = int(clock.timestamp() * 1e9)
            text = "".join(f"{format_ns(base + i * 1_731)} {line}\n" for i, line in enumerate(lines))
            out.write(text)
            written += len(text)

        while written < target:
            emit(trainer.startup_lines(restore_from=restore, at=clock))
            clock += timedelta(seconds=5)
            for _ in range(RESTART_EVERY):
                step += 1
                emit(trainer.step_lines(step, incarnation, at=clock, record=False))
                clock += timedelta(seconds=10)
                if written >= target:
                    break
            emit(trainer.preemption_lines())
            restore = trainer.last_checkpoint(step)
            step, incarnation = restore, incarnation + 1
    tmp.rename(path)


def prefix_copy(src: Path, dst: Path, fraction: float) -> None:
    size = int(src.stat().st_size * fraction)
    with open(src, "rb") as f, open(dst, "wb") as out:
        data = f.read(size)
        out.write(data[: data.rfind(b"\n") + 1])


def time_grep(path: Path, repeat: int = 3) -> tuple[float, int]:
    best, lines = float("inf"), 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            ["grep", "-F", "-e", "LOSS-PARTS", "-e", "REQUIRED_RBF", str(path)], stdout=subprocess.PIPE
        )
        lines = 0
        while chunk := proc.stdout.read(1 << 20):
            lines += chunk.count(b"\n")
        proc.wait()
        best = min(best, time.perf_counter() - t0)
    return best, lines


def _tree_rss(root: psutil.Process) -> int:
    """RSS of the ingest and every process it started (parse workers run under a forkserver)."""
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


LAUNCHER = """import sys
from steptail.cli import main
if __name__ == "__main__":
    sys.exit(main())
"""


# REV's C scan built as pyproject.toml builds this one's (setuptools, -O2): a baseline whose scan
# differs is timed with its own scan, not the Python fallback
BUILD_SCAN = """from setuptools import Extension, setup
setup(name="scan", ext_modules=[Extension("_steady", ["_steady.c"], extra_compile_args=["-O2"])],
      script_args=["build_ext", "--inplace", "-q"])
"""


def _build_scan(src: Path, dest: Path) -> bool:
    """Build `src`/_steady.c into `dest` (True), or say why not (False: the Python scan runs)."""
    where = src.parent / "scan-build"  # alone: the parsers' own modules (numbers.py) shadow the stdlib's
    where.mkdir()
    shutil.copy2(src / "_steady.c", where)
    (where / "build_scan.py").write_text(BUILD_SCAN)
    done = subprocess.run([sys.executable, "build_scan.py"], cwd=where, capture_output=True, text=True)
    built = sorted(where.glob("_steady*.so"))
    if done.returncode != 0 or not built:
        print(f"building the baseline's C scan failed: {done.stderr.strip()[-300:]}", file=sys.stderr)
        return False
    shutil.copy2(built[0], dest)
    return True


def baseline_tree(rev: str, work: Path, name: str = "baseline") -> tuple[list[str], dict[str, str]]:
    """The command and environment that run `steptail` as of git revision `rev`: its tree laid
    out as the installed package (steptail/ with runs, parsers, storage… inside), imported ahead
    of this checkout's editable install. Run from a folder other than the repository root."""
    src, pkg = work / f"{name}-src", work / f"{name}-pkg"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    shutil.copytree(src / "steptail", pkg / "steptail")
    for sub in ("runs", "parsers", "storage", "collector", "dashboards", "simcluster"):
        shutil.copytree(src / sub, pkg / "steptail" / sub)
    same_c = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", rev, "--", "parsers/_steady.c"]).returncode == 0
    built = sorted((ROOT / "parsers").glob("_steady*.so"))
    if same_c and built:
        shutil.copy2(built[0], pkg / "steptail" / "parsers")
    elif (src / "parsers" / "_steady.c").exists() and not _build_scan(src / "parsers", pkg / "steptail" / "parsers"):
        print(f"baseline {rev}: its C scan did not build here: it runs the Python scan", file=sys.stderr)
    (work / "launch.py").write_text(LAUNCHER)
    env = {**os.environ, "PYTHONPATH": str(pkg)}
    return [sys.executable, str(work / "launch.py")], env


def time_ingest(path: Path, work: Path, db: str | None = None, cmd: list[str] | None = None,
                env: dict[str, str] | None = None, tag: str = "") -> dict:
    pq = work / f"{path.stem}{tag}-pq"
    db = db or str(work / f"{path.stem}{tag}.db")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [*(cmd or [STEPTAIL]), "ingest", str(path), "--run", "bench", "--db", db, "--parquet", str(pq), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=work,
    )
    root, peak_tree = psutil.Process(proc.pid), 0
    while proc.poll() is None:  # sampled every 50 ms: the whole tree, workers included
        peak_tree = max(peak_tree, _tree_rss(root))
        time.sleep(0.05)
    seconds = time.perf_counter() - t0
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"ingest failed: {err.decode()}")
    return {"seconds": seconds, "peak_rss_mb": peak_tree / 2**20, "result": json.loads(out)}


def compare(log: Path, work: Path, rev: str, rounds: int, db, candidate: str | None = None) -> dict:
    """This checkout's ingest (or `candidate`'s) and `rev`'s in turn, `rounds` pairs, each into a
    fresh store (and Parquet folder, removed after): medians, pair ratios, and whether both
    stored the same."""
    cmd, env = baseline_tree(rev, work)
    now_cmd, now_env = baseline_tree(candidate, work, "candidate") if candidate else (None, None)
    now, base, ratios = [], [], []
    results = {}
    for i in range(rounds):
        for who in ("now", "base"):
            tag = f"-{who}{i}"
            got = time_ingest(log, work, db(), *((cmd, env) if who == "base" else (now_cmd, now_env)), tag=tag)
            (now if who == "now" else base).append(got["seconds"])
            results[who] = got["result"]
            for leftover in work.glob(f"{log.stem}{tag}*"):
                shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        ratios.append(now[-1] / base[-1])
    keys = ("lines", "loss_parts", "required_rbf", "pod_steps", "incarnations", "bad_lines", "flagged")
    return {
        "baseline": rev,
        "candidate": candidate or "this checkout",
        "rounds": rounds,
        "ingest_seconds_median": round(statistics.median(now), 2),
        "baseline_ingest_seconds_median": round(statistics.median(base), 2),
        "ratio_ingest_over_baseline": round(statistics.median(ratios), 4),
        "ratio_by_pair": [round(r, 4) for r in ratios],
        "same_records": all(results["now"][k] == results["base"][k] for k in keys),
    }


def store_floor(ingested: Path, work: Path, repeat: int = 3) -> dict[str, float]:
    """Seconds (best of `repeat` for each way) to insert the step tables' rows of the SQLite
    file `ingested` into an empty store of the same schema, in one transaction, with sqlite3
    alone: one row a statement, and as many as SqlSink puts in its largest statement (MULTI,
    capped by SQLite's parameters). The parameters are made before the clock starts."""
    import sqlite3
    from itertools import chain

    with contextlib.closing(sqlite3.connect(ingested)) as src:
        rows = {t: src.execute(f"SELECT {', '.join(COLUMNS[t])} FROM {t}").fetchall() for t in STEP_TABLES}

    def statements(multi: bool) -> list[tuple[str, list[tuple]]]:
        out = []
        for table, table_rows in rows.items():
            cols = COLUMNS[table]
            n = min(MULTI, MAX_PARAMS // len(cols)) if multi else 1
            one = f"({', '.join('?' * len(cols))})"
            whole = len(table_rows) - len(table_rows) % n
            sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES {{}} ON CONFLICT DO NOTHING"
            out.append((sql.format(", ".join([one] * n)),
                        [tuple(chain.from_iterable(table_rows[k: k + n])) for k in range(0, whole, n)]))
            out.append((sql.format(one), table_rows[whole:]))
        return out

    ways = {"one_row": statements(False), "sink_multi_row": statements(True)}
    best = dict.fromkeys(ways, float("inf"))
    for i in range(repeat):
        for way, todo in ways.items():
            path = work / f"floor-{i}-{way}.db"
            open_store(f"sqlite:///{path}").dispose()  # the schema, its indexes, page size and WAL as ingest has them
            with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
                conn.execute("PRAGMA synchronous=NORMAL")  # per connection, as the store sets it
                t0 = time.perf_counter()
                conn.execute("BEGIN")
                for sql, params in todo:
                    conn.executemany(sql, params)
                conn.execute("COMMIT")
                best[way] = min(best[way], time.perf_counter() - t0)
            path.unlink()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=420)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--baseline", metavar="REV", help="also time the ingest of steptail as of this git revision, "
                    "in turn with this checkout's (e.g. the commit before a change)")
    ap.add_argument("--rounds", type=int, default=3, help="with --baseline: pairs of ingests (default 3)")
    ap.add_argument("--candidate", metavar="REV2", help="with --baseline: REV2 timed instead of this checkout")
    ap.add_argument("--pg", metavar="ADMIN_URL",
                    help="ingest into a scratch database on this PostgreSQL server instead of SQLite "
                         "(e.g. postgresql+psycopg://postgres@127.0.0.1:5432/postgres)")
    args = ap.parse_args()

    CACHE.mkdir(parents=True, exist_ok=True)
    log = CACHE / f"ingest-{args.size_mb}mb.log"
    if not log.exists():
        print(f"generating {log} …", file=sys.stderr)
        generate(log, args.size_mb)
    with tempfile.TemporaryDirectory(prefix="steptail-bench-") as tmp:
        work = Path(tmp)
        quarter = work / "quarter.log"
        prefix_copy(log, quarter, 0.25)
        time_grep(log, 1)  # warm the page cache
        grep_s, grep_lines = time_grep(log)
        with contextlib.ExitStack() as stack:
            # each ingest its own empty database, as each gets its own SQLite file
            db = (lambda: stack.enter_context(scratch_database(args.pg, "steptail_bench"))) if args.pg \
                else (lambda: None)
            full = time_ingest(log, work, db())
            small = time_ingest(quarter, work, db())
            floor = None if args.pg else store_floor(work / f"{log.stem}.db", work)
            versus = compare(log, work, args.baseline, args.rounds, db, args.candidate) if args.baseline else None
    report = {
        "store": "postgresql" if args.pg else "sqlite",
        "file_mb": round(log.stat().st_size / 2**20, 1),
        "grep_seconds": round(grep_s, 3),
        "grep_lines": grep_lines,
        "ingest_seconds": round(full["seconds"], 2),
        "ratio_grep_over_ingest": round(grep_s / full["seconds"], 4),
        "ingest_peak_rss_mb": round(full["peak_rss_mb"], 1),  # all processes of the ingest
        "ingest_quarter_file_peak_rss_mb": round(small["peak_rss_mb"], 1),
        "ingest_mb_per_s": round(log.stat().st_size / 2**20 / full["seconds"], 1),
        "records": full["result"],
    }
    if floor is not None:
        least = min(floor.values())
        report |= {"store_floor_seconds": round(least, 2), "ratio_grep_over_store_floor": round(grep_s / least, 4),
                   "store_floor_seconds_by_way": {way: round(v, 2) for way, v in floor.items()}}
    if versus is not None:
        report["versus_baseline"] = versus
    if args.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:34} {v}")


if __name__ == "__main__":
    main()
