"""Benchmark of `follow --all` in a flooded namespace: the simulator (in this process, its
hostile hooks: simcluster/hostile.py) serves one real JobSet and N Pending process-0 pods, each
of its own JobSet. Measured: wall time, the follow process's peak RSS (`/usr/bin/time`), runs
followed, JobSets over --max-runs, list pages served, and runs stored.

    .venv/bin/python benchmarks/flood.py --json [--pods 20000] [--max-runs 100] [--duration 40]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from steptail.simcluster.cluster import SimCluster  # noqa: E402 - after the path
from steptail.storage.db import open_store  # noqa: E402

CLI = [sys.executable, "-c", "from steptail.cli import main; main()"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=20_000)
    ap.add_argument("--max-runs", type=int, default=100)
    ap.add_argument("--duration", type=float, default=40.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        scenario = {"namespace": "default", "rate": 50,
                    "jobsets": [{"name": "olmo3-sft", "hosts": 1, "trainer": {"steps": 60}}]}
        sim = SimCluster(scenario, state_dir=Path(d) / "sim")
        sim.start_in_thread()
        try:
            sim.api.hostile.flood = a.pods
            env = {k: v for k, v in os.environ.items() if k not in ("STEPTAIL_DB", "CLOUDSDK_CORE_ACCOUNT")}
            env["CLOUDSDK_CORE_ACCOUNT"] = sim.account
            db = f"sqlite:///{d}/s.db"
            t0 = time.monotonic()
            p = subprocess.run(["/usr/bin/time", "-f", "%M", *CLI, "follow", "-n", "default", "--kubeconfig",
                                str(sim.kubeconfig_path), "--db", db, "--no-view", "--json", "--all",
                                "--max-runs", str(a.max_runs), "--duration", str(a.duration)],
                               capture_output=True, text=True, env=env, check=True)
            wall = time.monotonic() - t0
            summary = json.loads(p.stdout)
            store = open_store(db)
            with store.engine.connect() as c:
                stored = c.execute(sa.text("SELECT COUNT(*) FROM runs")).scalar()
            store.dispose()
            report = {"pods": a.pods + 1, "max_runs": a.max_runs, "duration_s": a.duration,
                      "wall_s": round(wall, 1), "follow_peak_rss_mb": round(int(p.stderr.split()[-1]) / 1024, 1),
                      "runs_followed": len(summary["runs"]), "over_max_runs": summary["discovery"]["over_max_runs"],
                      "list_pages": sim.api.hostile.pages, "runs_stored": stored}
        finally:
            sim.stop_thread()
    print(json.dumps(report, indent=None if a.json else 2))


if __name__ == "__main__":
    main()
