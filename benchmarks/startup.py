"""What a steptail process spends before its own work starts: the imports of each command's
code, in a fresh interpreter, CPU and wall time (a replica restarting takes its runs back only
after them; every test and demo that runs `steptail follow` pays them).

    python benchmarks/startup.py [--rounds 7] [--baseline REV [--candidate REV2]] [--json]

Per target, `python -c "import MODULE"` from an empty folder: `follow` (steptail.collector.live.wiring,
all a follower loads before it reaches the cluster), `lint` (steptail.commands.lint and the
runbook engine), `cli` (steptail.cli: `steptail --help`), `read` (the commands `runs` and
`steps`, what an agent polling a run starts each time). --baseline REV: the same imports of
git revision REV's tree (laid out as installed, as benchmarks/ingest.py does), in turn with
this checkout's, medians and `ratio_cpu` (this / REV: below 1, faster). A tree imported ahead
of the editable install costs more than the install itself (about 0.25 s on `follow`): for a
like-for-like ratio give --candidate REV2 too (HEAD, say), both sides then run from trees."""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import baseline_tree  # noqa: E402 - the benchmarks' own helper, beside this file

TARGETS = {
    "follow": "steptail.collector.live.wiring",
    "lint": "steptail.commands.lint, steptail.runs.runbook",
    "cli": "steptail.cli",
    "read": "steptail.commands.runs, steptail.commands.steps",
}


def time_import(modules: str, cwd: Path, env: dict[str, str] | None) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one fresh interpreter importing `modules`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {modules}"], cwd=cwd, env=env, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(rounds: int, baseline: str | None, candidate: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="steptail-startup-") as tmp:
        work = Path(tmp)
        sides = {"this": baseline_tree(candidate, work, "candidate")[1] if candidate else None}
        if baseline:
            _, env = baseline_tree(baseline, work)
            sides["baseline"] = env
        out: dict = {"rounds": rounds, "baseline": baseline, "candidate": candidate, "targets": {}}
        for name, modules in TARGETS.items():
            got: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
            for env in sides.values():  # one warm-up each: the page cache, .pyc files
                time_import(modules, work, env)
            for _ in range(rounds):
                for side, env in sides.items():
                    got[side].append(time_import(modules, work, env))
            row = {}
            for side, samples in got.items():
                row[f"{side}_wall_s"] = round(statistics.median(w for w, _ in samples), 3)
                row[f"{side}_cpu_s"] = round(statistics.median(c for _, c in samples), 3)
            if baseline:
                row["ratio_cpu"] = round(row["this_cpu_s"] / row["baseline_cpu_s"], 3)
            out["targets"][name] = row
            print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in row.items()), file=sys.stderr)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7, help="imports per target and side (medians)")
    ap.add_argument("--baseline", metavar="REV", help="git revision to compare with, in the same run")
    ap.add_argument("--candidate", metavar="REV2", help="with --baseline: REV2's tree in place of this checkout")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    if args.candidate and not args.baseline:
        ap.error("--candidate needs --baseline")
    result = measure(args.rounds, args.baseline, args.candidate)
    if args.json:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
