"""Benchmark of the findings engine: `check` on a 100k-step run (SQLite and PostgreSQL) and
the per-step cost of the incremental (live) path.

    .venv/bin/python benchmarks/check.py [--steps 100000] [--pg URL] [--json]

The run is real-shaped (LOSS-PARTS + REQUIRED_RBF with kubelet timestamps, a restore that
replays 500 steps, a lost stretch, a few missing probes) and goes through the real run model
and SQL sink, as `ingest` writes it."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sqlalchemy as sa  # noqa: E402

from steptail.parsers import format_ns  # noqa: E402
from steptail.runs.detectors import FindingEngine
from steptail.runs.model import Batch, RunModel  # noqa: E402
from steptail.storage.db import open_store
from steptail.storage.findings import check_run, sync_findings
from steptail.storage.scratch import scratch_database  # noqa: E402
from steptail.storage.sql import SqlSink  # noqa: E402

T0 = 1_796_011_200_000_000_000
PG_ADMIN = os.environ.get("STEPTAIL_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def make_lines(steps: int) -> list[bytes]:
    out, t = [], T0

    def add(msg: str) -> None:
        out.append(f"{format_ns(t)} {msg}\n".encode())

    def start(restore: int | None = None) -> None:
        add("I1130 max_utils.py:290] Jax distributed system initialized! process_index=0 process_count=32")
        add("I1130 pyconfig.py:584] Config param ici_context_parallelism: 1")
        add("I1130 pyconfig.py:584] Config param context_parallel_load_balance: False")
        if restore:
            add(f"I1130 checkpointing.py:613] Restoring checkpoint from step {restore}.")

    cut = steps // 2
    start()
    plan = list(range(1, cut + 1)) + [None] + list(range(cut - 499, steps + 1))
    for s in plan:
        if s is None:
            start(restore=cut - 500)
            continue
        t += 12_000_000_000
        if 1000 <= s < 1004:
            continue  # a lost stretch
        ce = 3.8 - 1.2 * s / steps
        add(f"I1130 train_sft.py:301] LOSS-PARTS step={s} ce={ce:.6f} z_loss=1.2e-04 moe_lb=0.0124 total={ce + 0.0125:.6f}")
        if s % 9973:
            add(f"I1130 train.py:1333] REQUIRED_RBF step={s} max=1.3000 per_layer=[1.1,1.3] program=normal")
    return out


def load(url: str, lines: list[bytes]) -> None:
    store = open_store(url)
    model, sink = RunModel("bench"), SqlSink(store)
    for line in lines:
        model.feed(line)
    with store.engine.begin() as conn:
        sink.ensure_run(conn, "bench")
        sink.write(conn, "bench", model.take())
    store.dispose()


def time_check(url: str, repeat: int) -> dict:
    store = open_store(url)
    times, findings = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        findings = check_run(store, "bench")
        with store.engine.begin() as conn:
            sync_findings(conn, "bench", findings)
        times.append(time.perf_counter() - t)
    store.dispose()
    return {"check_seconds_median": round(statistics.median(times), 3),
            "check_seconds_min": round(min(times), 3), "findings": sorted({f.kind for f in findings}),
            "repeat": repeat}


def per_step_batches(lines: list[bytes]) -> list[Batch]:
    """The run model's batches, taken once per step as a live follower would."""
    model, out = RunModel("bench"), []
    for line in lines:
        model.feed(line)
        if b"REQUIRED_RBF" in line:
            out.append(model.take())
    out.append(model.take())
    return out


def time_incremental(lines: list[bytes]) -> dict:
    batches = per_step_batches(lines)
    engine = FindingEngine("bench")
    t = time.perf_counter()
    for b in batches:
        engine.observe(b)
        engine.tick(time.time_ns())
    engine.finish()
    total = time.perf_counter() - t
    steps = sum(len(b.loss_parts) for b in batches)
    return {"steps": steps, "batches": len(batches), "seconds": round(total, 3),
            "per_step_us": round(total / steps * 1e6, 2), "findings": sorted({f.kind for f in engine.findings.values()})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-pg", action="store_true", help="Skip PostgreSQL.")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    lines = make_lines(args.steps)
    report: dict = {"steps": args.steps, "lines": len(lines)}
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        load(url, lines)
        report["sqlite"] = time_check(url, args.repeat)
    if not args.no_pg:
        try:
            with scratch_database(PG_ADMIN, "steptail_bench") as url:
                load(url, lines)
                report["postgresql"] = time_check(url, args.repeat)
        except sa.exc.OperationalError as exc:  # no server here: say so in the report
            report["postgresql"] = {"error": str(getattr(exc, "orig", exc)).splitlines()[0]}
    report["incremental"] = time_incremental(lines)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
