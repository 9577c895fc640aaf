"""What line rate the simulator sustains on this machine: N JobSets of few hosts, each asked
for L process-0 lines/s, optionally each followed by a real `kubectl logs -f`.

    python -m steptail.simcluster.ratecheck --jobsets 12 --hosts 2 --lines 500 --seconds 10 [--follow] [--json]

Prints, per run, the asked and achieved process-0 lines/s per JobSet (from the truth's
journal: lines written), the steps/s, and with --follow the lines/s kubectl received.
A measurement, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import threading
import time

from steptail.simcluster.cluster import SimCluster
from steptail.simcluster.trainer import Trainer

LINES_PER_STEP = statistics.mean(len(Trainer(seed=0).step_lines(s, record=False)) for s in range(1, 201))


def _count(proc: subprocess.Popen, counter: list[int]) -> None:
    for _ in proc.stdout:
        counter[0] += 1


def _written(sim: SimCluster, names: list[str]) -> dict[str, tuple[int, int]]:
    """(process-0 lines written, last step) per JobSet: the truth's journal length, cheaply."""
    with sim.lock:
        return {n: (len(sim.state.journal[n]), sim.state.jobset(n).last_step) for n in names}


def measure(jobsets: int, hosts: int, lines: float, seconds: float, follow: bool) -> dict:
    rate = lines / LINES_PER_STEP  # steps/s that give `lines` process-0 lines/s
    names = [f"rate-{i:02d}" for i in range(jobsets)]
    sim = SimCluster({"rate": rate, "log_max_size": "10Mi", "jobsets": [
        {"name": n, "hosts": hosts, "trainer": {"steps": 10**7, "seed": i}} for i, n in enumerate(names)]})
    sim.start_in_thread()
    procs, counters = [], []
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(sim.jobset_state(n).state == "pending" for n in names):
            time.sleep(0.01)
        if follow:
            env = sim.env()
            env["HOME"] = str(sim.state_dir)
            for n in names:
                p = subprocess.Popen(["kubectl", "logs", "-f", sim.process0(n)], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                c = [0]
                threading.Thread(target=_count, args=(p, c), daemon=True).start()
                procs.append(p)
                counters.append(c)
            time.sleep(1.0)  # kubectl started and caught up with the head
        t0 = time.monotonic()
        before = _written(sim, names)
        got0 = [c[0] for c in counters]
        time.sleep(seconds)
        dt = time.monotonic() - t0
        after = _written(sim, names)
        got = [(c[0] - g) / dt for c, g in zip(counters, got0, strict=True)]
    finally:
        for p in procs:
            p.kill()
            p.wait(5)
        sim.stop_thread()
    written = [(after[n][0] - before[n][0]) / dt for n in names]
    steps = [(after[n][1] - before[n][1]) / dt for n in names]
    out = {"jobsets": jobsets, "hosts": hosts, "asked_lines_per_s": lines, "asked_steps_per_s": round(rate, 2),
           "seconds": round(dt, 2), "written_lines_per_s_min": round(min(written), 1),
           "written_lines_per_s_mean": round(statistics.mean(written), 1),
           "steps_per_s_mean": round(statistics.mean(steps), 2),
           "all_jobsets_lines_per_s": round(sum(written), 1)}
    if follow:
        out["followed_lines_per_s_min"] = round(min(got), 1)
        out["followed_lines_per_s_mean"] = round(statistics.mean(got), 1)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobsets", type=int, default=12)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--lines", type=float, nargs="+", default=[500.0], help="process-0 lines/s per JobSet")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--follow", action="store_true", help="a kubectl logs -f on every process 0")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    for lines in a.lines:
        r = measure(a.jobsets, a.hosts, lines, a.seconds, a.follow)
        print(json.dumps(r) if a.json else "  ".join(f"{k}={v}" for k, v in r.items()), flush=True)


if __name__ == "__main__":
    main()
