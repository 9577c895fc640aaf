"""Recovery time of the live collector after a cluster fault ends: from the fault's end (the
simulator's truth, `ApiOutage.to_ns`) to the next line the follower reads, and the steps a
later rotation took (issue 33, item 2). Real kubectl against the simulated cluster, one
JobSet at 20 steps/s (~130 lines/s), default options (`--silence` 30 s). Cases:

- auth_lapse: the stream ends and credentials are refused for 4 s;
- 503_burst: the stream ends and the next six log requests get 503;
- slow_api: the log rotates (the stream hangs) as single-pod and log reads turn 4 s late for
  20 s; here the time is from the rotation to the re-read's first line, as the fault
  outlasts the recovery.

Each case rotates the log again later: the steps lost say whether the wait cost data.
`recovery_s`: to the first such line handed to the run model; `served_s`: to the first the
API served (the simulator's truth: from then the lines are on their way, safe from a rotation).
A re-read that begins past a rotation asks for its pod once its first line came (that line is
the old container's only if the pod did not restart since): one round trip between the two.

    .venv/bin/python benchmarks/recovery.py --json [--cases auth_lapse,503_burst,slow_api]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from steptail.collector.cluster.kubectl import KubeTarget  # noqa: E402
from steptail.collector.live.follower import FollowConfig  # noqa: E402
from steptail.collector.live.stream_lines import StreamLines  # noqa: E402
from steptail.collector.live.supervisor import Plan, Supervisor  # noqa: E402
from steptail.simcluster.cluster import SimCluster  # noqa: E402
from steptail.storage.db import open_store  # noqa: E402
from steptail.storage.reads import iter_loss_parts  # noqa: E402

RATE = 20
CASES = {
    "auth_lapse": ([{"action": "eof_streams", "at_step": 40}, {"action": "auth_lapse", "at_step": 40, "seconds": 4}],
                   "auth_lapse", 240),
    "503_burst": ([{"action": "eof_streams", "at_step": 40},
                   {"action": "fail_next", "at_step": 40, "n": 6, "code": 503, "path": "/log"}], "fail_next", 240),
    "slow_api": ([{"action": "rotate", "at_step": 100},
                  {"action": "slow_api", "at_step": 100, "seconds": 20, "delay": 4.0, "path": "/pods/"}],
                 "rotate", 420),
}

reads: list[tuple[int, int | None]] = []  # (wall ns, kubelet stamp) of every line the follower was handed


def _record_reads() -> None:
    feed = StreamLines.feed

    def timed(self, line, ts_ns, key, check):
        reads.append((time.time_ns(), ts_ns))
        return feed(self, line, ts_ns, key, check)

    StreamLines.feed = timed


def run_case(name: str, workdir: Path) -> dict:
    faults, fault_kind, rotate_at = CASES[name]
    steps = rotate_at + 100
    scenario = {"namespace": "default", "rate": RATE, "grace_seconds": 3, "restart_pending_seconds": 0.3,
                "jobsets": [{"name": "olmo3-sft", "hosts": 1, "trainer": {"steps": steps, "checkpoint_period": 1000}}],
                "faults": [*faults, {"action": "rotate", "at_step": rotate_at}]}
    sim = SimCluster(scenario, state_dir=workdir / f"sim-{name}")
    sim.start_in_thread()
    reads.clear()
    db = str(workdir / f"{name}.db")
    store = open_store(db)
    try:
        target = KubeTarget(sim.scenario.namespace, sim.account, str(sim.kubeconfig_path))
        plan = Plan(target, {"olmo3-sft": "r"}, config=FollowConfig(until_done=True))

        async def main() -> None:
            sup = Supervisor(store, plan)
            task = asyncio.create_task(sup.run(install_signals=False))
            deadline = time.monotonic() + steps / RATE + 60
            while not task.done() and time.monotonic() < deadline:
                await asyncio.wait([task], timeout=0.2)
            sup.stop()
            await task

        asyncio.run(main())
        got = {s for _, s, *_ in iter_loss_parts(store, "r")}
        lines = sim.truth.servable("olmo3-sft")
    finally:
        store.dispose()
        sim.stop_thread()
    if fault_kind == "rotate":  # the hang: to the first line written after it (the re-read's)
        end = next(f.wall_ns for f in sim.truth.faults() if f.action == "rotate")
        after = [t for t, ts in reads if ts is not None and ts > end]
        # the first line written after it (a look at the pod's newest line serves a later one)
        first = min((ln for ln in lines if ln.wall_ns > end), key=lambda ln: ln.wall_ns, default=None)
        served = [first.served_ns] if first is not None and first.served_ns is not None else []
    else:  # to the next line read, whatever it is
        end = next(o.to_ns for o in sim.truth.unavailable() if o.kind == fault_kind)
        after = [t for t, _ in reads if end is not None and t > end]
        served = [ln.served_ns for ln in lines if end is not None and ln.served_ns is not None
                  and ln.served_ns > end]
    return {"case": name, "recovery_s": round((after[0] - end) / 1e9, 2) if after else None,
            "served_s": round((min(served) - end) / 1e9, 2) if served else None,
            "steps": steps, "recorded": len(got), "lost": steps - len(got)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    _record_reads()
    with tempfile.TemporaryDirectory() as tmp:
        results = [run_case(c, Path(tmp)) for c in args.cases.split(",")]
    if args.json:
        print(json.dumps({"recovery": results}, indent=2))
    else:
        for r in results:
            print(f"{r['case']:<12} recovery {r['recovery_s']} s  recorded {r['recorded']}/{r['steps']}")


if __name__ == "__main__":
    main()
