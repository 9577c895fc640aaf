"""`steptail demo`: a simulated cluster with faults, followed live with the real kubectl."""

from __future__ import annotations

import asyncio
import logging
import shlex
import shutil
import sys
from pathlib import Path

import click

from steptail.commands._common import fail
from steptail.output import Output, output_option

NS = "demo"


def demo_scenario(seconds: float) -> dict:
    """Two JobSets over `seconds`: a rotation hang, an EOF, a JobSet restart, an auth lapse,
    a double rotation (lines really lost), a NaN step and context parallelism with load balancing."""
    rate = 200 / seconds  # ~200 steps in the demo

    def at(fraction: float) -> float:
        return round(seconds * fraction, 2)

    return {
        "namespace": NS, "seed": 7, "rate": rate, "grace_seconds": max(2.0, seconds / 10),
        "restart_pending_seconds": 1.0,
        "jobsets": [
            {"name": "olmo3-sft", "hosts": 4,
             "trainer": {"steps": 220, "checkpoint_period": 50}},
            {"name": "qwen3-cp4", "hosts": 4,
             "trainer": {"steps": 220, "checkpoint_period": 50, "context_parallelism": 4,
                         "load_balance": True, "nan_steps": [90]}},
        ],
        "faults": [
            {"action": "rotate", "jobset": "olmo3-sft", "at": at(0.15)},  # hang: silent, no EOF
            {"action": "eof_streams", "at": at(0.30)},  # idle timeout: every stream ends
            {"action": "restart_jobset", "jobset": "olmo3-sft", "at": at(0.45)},  # preemption
            {"action": "auth_lapse", "at": at(0.62), "seconds": max(2.0, seconds / 15)},
            {"action": "eof_streams", "at": at(0.63)},  # reconnects meet the lapsed login
            {"action": "rotate", "jobset": "qwen3-cp4", "at": at(0.78)},  # two rotations faster than
            {"action": "rotate", "jobset": "qwen3-cp4", "at": at(0.78) + 0.4},  # any follower: a real gap
        ],
    }


@click.command()
@click.option("--dir", "out_dir", default="steptail-demo", show_default=True, type=click.Path(file_okay=False),
              help="Where the demo writes its SQLite file and Parquet tables.")
@click.option("--seconds", type=float, default=60.0, show_default=True, help="How long the simulated runs take.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port of the simulated Kubernetes API server (0: any free port).")
@click.option("--no-view", is_flag=True, help="No live table.")
@output_option()
def command(out_dir: str, seconds: float, port: int, no_view: bool, output: Output) -> None:
    """Start a simulated GKE cluster with two training JobSets and scripted faults (rotation
    hang, EOF, JobSet restart, auth lapse, lost lines), follow them with the real kubectl
    into DIR (SQLite + Parquet), then print what was recorded and flagged."""
    from steptail.collector.cluster.kubectl import KubeTarget
    from steptail.collector.live.follower import FollowConfig
    from steptail.collector.live.supervisor import Plan
    from steptail.collector.live.wiring import follow
    from steptail.simcluster.cluster import SimCluster
    from steptail.storage.db import StoreError, open_store

    if seconds < 8:
        fail("--seconds must be at least 8")
    if shutil.which("kubectl") is None:
        fail("kubectl not found on PATH")
    out = Path(out_dir).absolute()
    out.mkdir(parents=True, exist_ok=True)
    db, parquet = out / "steptail.db", out / "parquet"
    for stale in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        stale.unlink(missing_ok=True)  # the demo starts from scratch every time
    shutil.rmtree(parquet, ignore_errors=True)
    try:
        store = open_store(str(db))
    except StoreError as exc:
        fail(str(exc))
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    console = output.console
    sim = SimCluster(demo_scenario(seconds), port=port, state_dir=out / "simcluster",
                     kubeconfig_out=out / "simcluster" / "kubeconfig")
    try:
        sim.start_in_thread()
    except OSError as exc:  # e.g. --port taken
        store.dispose()
        fail(f"cannot start the simulated cluster on port {port}: {exc.strerror or exc}")
    try:
        if not output.machine:
            output.print(f"simulated cluster on {sim.server_url}; following JobSets olmo3-sft and qwen3-cp4 "
                         f"in namespace {NS} for ~{seconds:.0f} s …")
        target = KubeTarget(NS, sim.account, str(sim.kubeconfig_path))
        plan = Plan(target, jobsets={"olmo3-sft": "olmo3-sft", "qwen3-cp4": "qwen3-cp4"}, parquet=str(parquet),
                    config=FollowConfig(until_done=True, parquet_every=10.0))  # follow's defaults
        view = console.is_terminal and not no_view and not output.machine
        sup = asyncio.run(follow(store, plan, view=view, console=console, duration=seconds * 2 + 30))
        report = _report(store, sup, sim, db, parquet)
    finally:
        sim.stop_thread()
        store.dispose()
    if output.machine:
        output.data(report, report["runs"])
    else:
        _print(output, report)


def _report(store, sup, sim, db: Path, parquet: Path) -> dict:
    from steptail.storage.status import recorded

    stored = recorded(store, list(sup.status))
    runs = []
    for run, st in sup.status.items():
        truth, rec = sim.truth(st.jobset), stored[run]
        runs.append({
            "run": run,
            "state": st.state,
            "steps_recorded": rec.steps,
            "steps_written_by_trainer": len(truth),
            "steps_lost_to_rotation": sorted(t.step for t in truth if t.rotated_unread),
            "incarnations": rec.incarnations,
            "reconnects": st.reconnects,
            "failures": [{"kind": f.kind, "reason": f.reason} for f in sup.detectors[run].failures],
            "stream_gaps": [{"stream": s, "start_ns": a, "end_ns": b, "reason": why}
                            for s, a, b, why in rec.stream_gaps],
            "findings": [{"kind": k, "incarnation": i, "first_step": a, "last_step": b, "severity": sev,
                          "detail": d} for k, i, a, b, sev, d in rec.findings],
        })
    return {"db": str(db), "parquet": str(parquet), "runs": runs}


def _print(output: Output, report: dict) -> None:
    """Every line unwrapped (Output.print): paths and commands stay whole when piped."""
    from steptail.parsers.timestamps import format_ns

    for r in report["runs"]:
        output.console.rule(f"[bold]{r['run']}")
        output.print(f"{r['steps_recorded']} steps recorded of {r['steps_written_by_trainer']} written "
                     f"({r['incarnations']} incarnations), {r['reconnects']} reconnects, state {r['state']}")
        if r["steps_lost_to_rotation"]:
            lost = r["steps_lost_to_rotation"]
            output.print(f"[red]lost to log rotation (simulator truth): steps {lost[0]}…{lost[-1]} "
                         f"({len(lost)})[/]")
        for g in r["stream_gaps"]:
            end = format_ns(g["end_ns"]) if g["end_ns"] else "?"
            output.print(f"  stream gap {format_ns(g['start_ns'])} → {end}: {g['reason']}", markup=False)
        kinds: dict[str, int] = {}
        for f in r["failures"]:
            kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
        for kind, n in kinds.items():
            reason = next(f["reason"] for f in r["failures"] if f["kind"] == kind)
            output.print(f"  follower failure {kind} ×{n}: {reason}", markup=False)
        for f in r["findings"]:
            output.print(f"  [yellow]{f['severity']}[/] {f['kind']} (inc {f['incarnation']}, steps "
                         f"{f['first_step']}–{f['last_step']}): {f['detail']}", highlight=False)
    db = report["db"]
    output.console.rule("data")
    output.print(f"SQLite:  {db}", markup=False)
    output.print(f"Parquet: {report['parquet']}", markup=False)
    arg = shlex.quote(db)  # ready to paste, whatever the directory is called
    for i, cmd in enumerate((f"steptail runs --db {arg}", f"steptail steps olmo3-sft --db {arg}",
                             f"steptail check qwen3-cp4 --db {arg}")):
        output.print(f"{'try:' if i == 0 else '':9}{cmd}", markup=False)
