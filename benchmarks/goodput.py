"""Speed of `steptail goodput` on one long run and of `steptail mesh` over many runs (SQLite).

    .venv/bin/python benchmarks/goodput.py --json [--steps 200000] [--runs 1000] [--run-steps 500] [--baseline REV]

The long run: a generated --timestamps process-0 log (LOSS-PARTS and `completed step` lines,
a save every 1,000 steps, a preemption every 40,500 executed steps restored from the last save, so
steps are replayed; every 100th step a profiler step without `seconds`), ingested with
`steptail ingest`, then `steptail goodput RUN -o json` timed as a process (best of --reps,
Python start-up included) and `storage.goodput.run_goodput` in process; then 40 live-like
commits of 3 steps each appended to it (`live_commit`: a commit's median and the goodput
state's part of it, which must not grow with the run).

The fleet: --runs runs of --run-steps steps, two incarnations each, six mesh configurations on
three slices, written straight into a fresh store (rows as ingest stores them, and the goodput state
built from them), then
`steptail mesh -o json` timed as a process.

--baseline REV: the long run's ingest and `steptail goodput` as of git revision REV too (its
tree from `git archive`, as benchmarks/ingest.py runs it), in the same run, into its own store:
`ratio_goodput_cli_over_baseline` (this / REV: below 1, faster)."""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from steptail.parsers import format_ns  # noqa: E402
from steptail.storage.db import open_store  # noqa: E402
from steptail.storage.goodput import rebuild, run_goodput  # noqa: E402

STEPTAIL = str(Path(sys.executable).parent / "steptail")
T0 = 1_796_011_200 * 10**9
SAVE_EVERY, RESTART_EVERY = 1_000, 40_500  # preempted 500 steps past a save: 500 replayed


def write_long_log(path: Path, steps: int) -> None:
    """`steps` surviving steps, a restart every RESTART_EVERY executed steps."""
    t, step, inc, executed = T0, 0, 1, 0
    with open(path, "w") as out:
        w = out.write

        def line(msg: str) -> None:
            w(f"{format_ns(t)} I1130 00:00:00.000000 1 train.py:1] {msg}\n")

        while step < steps:
            line("Attempting to initialize the jax distributed system...")
            line("Config param ici_fsdp_parallelism: 8")
            if step:
                line(f"Restoring checkpoint from step {step}.")
            t += 30 * 10**9
            for _ in range(RESTART_EVERY):
                step += 1
                executed += 1
                t += 10 * 10**9 + (step % 7) * 10**7
                line(f"LOSS-PARTS step={step} ce=2.5 z_loss=1e-04 moe_lb=0.01 total=2.51 weights=1048576")
                secs = "" if step % 100 == 0 else ", seconds: 10.000"
                line(f"completed step: {step}{secs}, TFLOP/s/device: 180.0, Tokens/s/device: 4000.0")
                if step % SAVE_EVERY == 0:
                    t += 5 * 10**9
                    line(f"Saved a checkpoint at step {step}.")
                if step >= steps:
                    break
            if step < steps:  # preempted: back to the last save, those steps run again
                step -= step % SAVE_EVERY
                t += 120 * 10**9
                inc += 1


def best(argv: list[str], reps: int, env: dict | None = None, cwd: Path | None = None) -> tuple[float, str]:
    times, out = [], ""
    for _ in range(reps):
        t = time.perf_counter()
        out = subprocess.run(argv, check=True, capture_output=True, text=True, env=env, cwd=cwd).stdout
        times.append(time.perf_counter() - t)
    return min(times), out


def long_run(work: Path, steps: int, reps: int, baseline: str | None = None) -> dict:
    log = work / "long.log"
    write_long_log(log, steps)
    out = {"steps": steps, "log_mb": round(log.stat().st_size / 2**20, 1)}
    if baseline is not None:
        # benchmarks/ingest.py: REV's tree, run ahead of this checkout
        from ingest import baseline_tree

        cmd, env = baseline_tree(baseline, work)
        base = _timed_run(log, work / "base.db", cmd, reps, env)
        out["baseline"] = {"rev": baseline, **base}
    now = _timed_run(log, work / "long.db", [STEPTAIL], reps)
    store = open_store(str(work / "long.db"), create=False)
    try:
        inproc = []
        for _ in range(reps):
            t = time.perf_counter()
            run_goodput(store, "long")
            inproc.append(time.perf_counter() - t)
    finally:
        store.dispose()
    out.update(now, goodput_in_process_s=round(min(inproc), 4))
    out["live_commit"] = live_commits(work / "long.db")
    if baseline is not None:
        out["ratio_goodput_cli_over_baseline"] = round(now["goodput_cli_s"] / out["baseline"]["goodput_cli_s"], 3)
        out["ratio_ingest_over_baseline"] = round(now["ingest_s"] / out["baseline"]["ingest_s"], 3)
        out["same_figures_as_baseline"] = {k: out["baseline"][k] == now[k] for k in ("incarnations", "goodput",
                                                                                     "replayed_s")}
    return out


def live_commits(db: Path, commits: int = 40, per: int = 3) -> dict:
    """Commits of `per` new steps each appended to the long run, as `follow` writes them (the
    run model, SqlSink): median ms of a commit, and of the goodput state's part of it."""
    import sqlalchemy as sa

    from steptail.storage import goodput
    from steptail.storage.sql import SqlSink, load_model

    store = open_store(str(db), create=False)
    spent: list[float] = []
    real = goodput.after_write

    def timed(conn, batch, *rest) -> None:
        t = time.perf_counter()
        real(conn, batch, *rest)
        spent.append(time.perf_counter() - t)

    goodput.after_write = timed
    try:
        with store.engine.connect() as conn:
            step, ts = conn.execute(sa.text("SELECT step, ts_ns FROM loss_parts WHERE run = 'long'"
                                            " ORDER BY incarnation DESC, step DESC LIMIT 1")).one()
            model = load_model(conn, "long")
        sink, totals = SqlSink(store), []
        for _ in range(commits):
            for _ in range(per):
                step, ts = step + 1, ts + 10 * 10**9
                glog = "I1130 00:00:00.000000 1 train.py:1]"
                model.feed(f"{format_ns(ts)} {glog} LOSS-PARTS step={step} ce=2.5 z_loss=1e-04 moe_lb=0.01"
                           f" total=2.51 weights=1048576\n".encode())
                model.feed(f"{format_ns(ts + 10**6)} {glog} completed step: {step}, seconds: 10.000,"
                           f" TFLOP/s/device: 180.0, Tokens/s/device: 4000.0\n".encode())
            batch = model.take()
            t = time.perf_counter()
            with store.engine.begin() as conn:
                sink.write(conn, "long", batch)
            totals.append(time.perf_counter() - t)
    finally:
        goodput.after_write = real
        store.dispose()
    return {"commits": commits, "steps_each": per, "commit_median_ms": round(statistics.median(totals) * 1000, 2),
            "goodput_state_median_ms": round(statistics.median(spent) * 1000, 2)}


def _timed_run(log: Path, db: Path, cmd: list[str], reps: int, env: dict | None = None) -> dict:
    """`ingest` then `goodput -o json` by `cmd` (a steptail), from outside the repository."""
    t = time.perf_counter()
    subprocess.run([*cmd, "ingest", str(log), "--run", "long", "--db", str(db)], check=True, capture_output=True,
                   env=env, cwd=db.parent)
    ingest_s = time.perf_counter() - t
    cli_s, text = best([*cmd, "goodput", "long", "--db", str(db), "-o", "json"], reps, env, db.parent)
    g = json.loads(text)
    return {"ingest_s": round(ingest_s, 2), "goodput_cli_s": round(cli_s, 3),
            "incarnations": len(g["incarnations"]), "goodput": round(g["goodput"], 4),
            "replayed_s": round(g["replayed_s"], 1)}


MESHES = [(fsdp, cp) for fsdp in (4, 8, 16) for cp in (1, 2)]
SLICES = [("4x4", 4), ("4x8", 8), ("8x8", 16)]


def fleet(work: Path, runs: int, run_steps: int, reps: int) -> dict:
    db = work / "fleet.db"
    open_store(str(db)).dispose()  # the schema
    con = sqlite3.connect(db)
    t0 = time.perf_counter()
    with con:
        for r in range(runs):
            run, (fsdp, cp), (topo, hosts) = f"run-{r:05d}", MESHES[r % len(MESHES)], SLICES[r % len(SLICES)]
            base = T0 + r * 10**12
            con.execute("INSERT INTO runs (run, created_ns, updated_ns) VALUES (?, ?, ?)", (run, base, base))
            half = run_steps // 2
            for inc, (lo, hi) in enumerate(((1, half + 20), (half + 1, run_steps)), start=1):
                start = base + (0 if inc == 1 else (half + 40) * 10 * 10**9)
                con.execute("INSERT INTO incarnations (run, incarnation, started_ns, saw_start, first_step,"
                            " last_step, topology, hosts) VALUES (?, ?, ?, 1, ?, ?, ?, ?)",
                            (run, inc, start, lo, hi, topo, hosts))
                con.executemany("INSERT INTO config (run, incarnation, name, value) VALUES (?, ?, ?, ?)",
                                [(run, inc, "ici_fsdp_parallelism", str(fsdp)),
                                 (run, inc, "ici_context_parallelism", str(cp)),
                                 (run, inc, "per_device_batch_size", "1")])
                secs = 10.0 * 8 / fsdp / cp
                ts = [start + (s - lo + 3) * int(secs * 1e9) for s in range(lo, hi + 1)]
                con.executemany("INSERT INTO loss_parts (run, incarnation, step, ts_ns, ce, ce_raw, parts)"
                                " VALUES (?, ?, ?, ?, 2.5, '2.5', '{}')",
                                [(run, inc, s, t) for s, t in zip(range(lo, hi + 1), ts, strict=True)])
                con.executemany("INSERT INTO pod_metrics (run, incarnation, step, ts_ns, seconds, tflops,"
                                " tokens_per_s, extra) VALUES (?, ?, ?, ?, ?, 180.0, 4000.0, '{}')",
                                [(run, inc, s, t, secs) for s, t in zip(range(lo, hi + 1), ts, strict=True)])
                con.execute("INSERT INTO loss_summary (run, incarnation, steps, lo, hi, first_ts_ns, last_ts_ns)"
                            " VALUES (?, ?, ?, ?, ?, ?, ?)", (run, inc, hi - lo + 1, lo, hi, ts[0], ts[-1]))
    con.close()
    store = open_store(str(db), create=False)
    try:  # the goodput state a commit keeps (storage.goodput), built as migration 0014 builds it
        with store.engine.begin() as conn:
            for r in range(runs):
                rebuild(conn, f"run-{r:05d}")
    finally:
        store.dispose()
    load_s = time.perf_counter() - t0
    cli_s, out = best([STEPTAIL, "mesh", "--db", str(db), "-o", "json"], reps)
    return {"runs": runs, "run_steps": run_steps, "load_s": round(load_s, 2), "mesh_cli_s": round(cli_s, 3),
            "rows": len(json.loads(out))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=1_000)
    ap.add_argument("--run-steps", type=int, default=500)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--baseline", metavar="REV", help="also time the long run as of git revision REV")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="steptail-goodput-") as tmp:
        work = Path(tmp)
        result = {"long_run": long_run(work, args.steps, args.reps, args.baseline),
                  "fleet": fleet(work, args.runs, args.run_steps, args.reps)}
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
