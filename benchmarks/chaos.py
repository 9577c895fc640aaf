"""Chaos benchmark (issue 19): long, slow-rate random fault schedules, one per seed, each
followed by `steptail follow --all` (real kubectl) and judged by the chaos oracle
(simcluster/oracle.py); per-seed verdict lines, then one table of the summed counts — steps
servable, recorded, lost and flagged, lost before anyone could read them, lost unflagged
(goal 0), servable but missed (goal 0), duplicated (goal 0), false incarnations (goal 0), false
critical findings (goal 0), (replicas) double follows and slow takeovers (goal 0), the worst
time from a fault's end to rows flowing again (worst_recovery_s, store samples every 0.25 s)
and to the next line the API served (worst_read_recovery_s, the simulator's truth), the
longest a step never recorded was servable while following (worst_unrecorded_s; the oracle
allows < 5 s) — and the failing seeds (a seed whose run failed before it could be judged,
its followers never up, is listed apart as not judged, its work dir kept with --keep). The
faults are drawn with issue 33's kinds (slow API over rotations, auth lapse then 5xx, 503 x5-6
on logs, 429, old repeats, clock back then rotation, checkpoint pause then rotations, JobSets
without optional fields); `--kinds issue19` draws the schedules from before them.

    .venv/bin/python benchmarks/chaos.py --seeds 200 [--replicas 2] [--json]
    .venv/bin/python benchmarks/chaos.py --seeds 10 --duration 30 --first 1000
    .venv/bin/python benchmarks/chaos.py --seeds 200 --duration 20 --jobs 2 --json

SQLite by default; with --replicas (or --pg) a scratch database on PostgreSQL per seed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from steptail.simcluster.chaos import ISSUE19_KINDS, draw_schedule  # noqa: E402
from steptail.simcluster.chaos_run import run_schedule  # noqa: E402
from steptail.simcluster.oracle import COUNTS, summarize  # noqa: E402
from steptail.storage.scratch import scratch_database  # noqa: E402

PG_ADMIN = os.environ.get("STEPTAIL_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def one_seed(seed: int, args, work: Path):
    echo = (lambda s: print(s, file=sys.stderr, flush=True)) if args.json else (lambda s: print(s, flush=True))
    schedule = draw_schedule(seed, duration=args.duration, rates=(args.min_rate, args.max_rate),
                             jobsets=(1, args.max_jobsets), replicas=args.replicas,
                             faults_per_second=args.faults_per_second,
                             kinds=ISSUE19_KINDS if args.kinds == "issue19" else None)
    try:
        if args.replicas or args.pg:
            with scratch_database(PG_ADMIN, "steptail_chaos_bench") as db:
                verdict = run_schedule(schedule, db, work / f"seed{seed}", echo=echo)[0]
        else:
            verdict = run_schedule(schedule, f"sqlite:///{work / f'seed{seed}.db'}", work / f"seed{seed}",
                                   echo=echo)[0]
    except Exception as exc:  # the run could not be judged: said and kept, the other seeds go on
        echo(f"seed {seed}: ERROR, not judged: {type(exc).__name__}: {exc}")
        if args.keep and (work / f"seed{seed}").exists():
            kept = Path(args.keep) / f"seed{seed}"
            shutil.copytree(work / f"seed{seed}", kept, dirs_exist_ok=True)
            echo(f"seed {seed}: its followers' logs kept in {kept}")
        return Errored(seed, f"{type(exc).__name__}: {exc}")
    if not verdict.ok and args.keep:
        # the followers' logs and the simulator's state of a failing seed outlive the scratch dir
        kept = Path(args.keep) / f"seed{seed}"
        shutil.copytree(work / f"seed{seed}", kept, dirs_exist_ok=True)
        echo(f"seed {seed}: its followers' logs kept in {kept}")
    return verdict


@dataclass
class Errored:
    """A seed whose run failed before it could be judged (its simulator or followers never got
    going): no verdict of steptail's, and no seed to leave out of the table unsaid."""
    seed: int
    error: str


def table(total: dict) -> str:
    cols = [*COUNTS, "worst_recovery_s", "worst_read_recovery_s", "worst_unrecorded_s"]
    width = max(len(c) for c in cols)
    lines = [f"{'seeds':<{width}}  {total['seeds']}"]
    lines += [f"{c:<{width}}  {total[c]}" for c in cols]
    lines.append(f"{'failing seeds':<{width}}  {' '.join(map(str, total['failing_seeds'])) or '-'}")
    lines.append(f"{'not judged':<{width}}  {' '.join(str(e['seed']) for e in total['errored']) or '-'}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=200, help="how many seeds")
    ap.add_argument("--first", type=int, default=1000, help="the first seed")
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of training per schedule")
    ap.add_argument("--replicas", type=int, default=0, help="2-3: replicas on PostgreSQL with their own faults")
    ap.add_argument("--pg", action="store_true", help="PostgreSQL (a scratch database per seed), not SQLite")
    ap.add_argument("--min-rate", type=float, default=0.5, help="lines/s, low end")
    ap.add_argument("--max-rate", type=float, default=50.0, help="lines/s, high end")
    ap.add_argument("--max-jobsets", type=int, default=12)
    ap.add_argument("--faults-per-second", type=float, default=0.15)
    ap.add_argument("--jobs", type=int, default=1,
                    help="seeds at once, each in its own process (a simulator and followers each: "
                         "more than the cores starves them and skews the verdicts)")
    ap.add_argument("--kinds", choices=["all", "issue19"], default="all",
                    help="fault kinds drawn: all (default, with issue 33's) or issue19 (the schedules before them)")
    ap.add_argument("--json", action="store_true", help="one JSON object (verdicts and the table) on stdout")
    ap.add_argument("--keep", metavar="DIR", help="copy a failing seed's work dir (its followers' logs, the "
                    "simulator's state) to DIR/seedN")
    args = ap.parse_args()
    t0 = time.time()
    seeds = range(args.first, args.first + args.seeds)
    with tempfile.TemporaryDirectory(prefix="steptail-chaos-") as d:
        if args.jobs > 1:
            with ProcessPoolExecutor(args.jobs) as pool:
                verdicts = list(pool.map(partial(one_seed, args=args, work=Path(d)), seeds))
        else:
            verdicts = [one_seed(seed, args, Path(d)) for seed in seeds]
    errored = [v for v in verdicts if isinstance(v, Errored)]
    verdicts = [v for v in verdicts if not isinstance(v, Errored)]
    total = summarize(verdicts)
    total["errored"] = [{"seed": e.seed, "error": e.error} for e in errored]
    total["wall_s"] = round(time.time() - t0, 1)
    if args.json:
        print(json.dumps({"args": vars(args), "total": total,
                          "verdicts": [{"seed": v.seed, "ok": v.ok, **v.counts,
                                        "worst_recovery_s": round(v.worst_recovery, 2),
                                        "worst_read_recovery_s": round(v.worst_read_recovery, 2),
                                        "worst_unrecorded_s": round(v.worst_unrecorded, 2), "line": v.line()}
                                       for v in verdicts]}))
    else:
        print(table(total))


if __name__ == "__main__":
    main()
