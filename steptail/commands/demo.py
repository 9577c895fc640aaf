"""`steptail demo`: a simulated cluster with faults, followed live with the real kubectl."""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
import socket
import sys
from pathlib import Path

import click

from steptail import logs
from steptail.commands._common import count, fail
from steptail.commands.lint import policy_from
from steptail.output import Output, output_option

NS = "demo"
# The story: qwen3-cp4 runs ici_context_parallelism 4 with context_parallel_load_balance on,
# which the runbook forbids (the loss goes wrong). qwen3-cp1 is its control: the same seed
# (data order and weights), the same 4-host slice, no context parallelism. The simulated
# trainer prints the arm's CE above the control's by the bug's effect (simcluster/trainer.py).
ARM, CONTROL = "qwen3-cp4", "qwen3-cp1"
JOBSETS = ("olmo3-sft", ARM, CONTROL)
QWEN_SEED = 3
SERVE_PORT = 9464  # `steptail serve`'s default; another free port when it is taken
REFERENCE = "hf-reference"  # the step-1 gate's reference CE of the arm and its control, beside the store


def demo_scenario(seconds: float) -> dict:
    """Three JobSets over `seconds`: a rotation hang, an EOF, a JobSet restart, an auth lapse,
    a double rotation (lines really lost), a NaN step, and context parallelism with load
    balancing (qwen3-cp4) beside its control (qwen3-cp1)."""
    rate = 200 / seconds  # ~200 steps in the demo

    def at(fraction: float) -> float:
        return round(seconds * fraction, 2)

    return {
        "namespace": NS, "seed": 7, "rate": rate, "grace_seconds": max(2.0, seconds / 10),
        "restart_pending_seconds": 1.0,
        "jobsets": [
            {"name": "olmo3-sft", "hosts": 4,
             "trainer": {"steps": 220, "checkpoint_period": 50}},
            {"name": ARM, "hosts": 4,
             "trainer": {"steps": 220, "checkpoint_period": 50, "seed": QWEN_SEED, "context_parallelism": 4,
                         "load_balance": True, "nan_steps": [90]}},
            {"name": CONTROL, "hosts": 4,
             "trainer": {"steps": 220, "checkpoint_period": 50, "seed": QWEN_SEED}},
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
    """Start a simulated GKE cluster with three training JobSets and scripted faults (rotation
    hang, EOF, JobSet restart, auth lapse, lost lines; an arm with context parallelism and load
    balancing beside its control), follow them with the real kubectl into DIR (SQLite +
    Parquet), then print what was recorded and flagged, write two charts (the arm against its
    control, olmo3-sft's CE) and print commands to look further."""
    from steptail.collector.cluster.kubectl import KubeTarget
    from steptail.collector.live.follower import FollowConfig
    from steptail.collector.live.supervisor import Plan
    from steptail.collector.live.wiring import follow
    from steptail.live_view import table
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
    for name, _ in CHARTS:
        (out / name).unlink(missing_ok=True)
    try:
        store = open_store(str(db))
    except StoreError as exc:
        fail(str(exc))
    logs.configure("text")  # follow's log lines, above the live table, never inside it
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
            output.print(f"simulated cluster on {sim.server_url}; following JobSets {', '.join(JOBSETS)} "
                         f"in namespace {NS} for ~{seconds:.0f} s …")
        target = KubeTarget(NS, sim.account, str(sim.kubeconfig_path))
        plan = Plan(target, jobsets={name: name for name in JOBSETS}, parquet=str(parquet),
                    config=FollowConfig(until_done=True, parquet_every=10.0),  # follow's defaults
                    reference_ce=hf_reference(out / REFERENCE),
                    policy=policy_from(None))  # the runbook's rules on the live JobSets, as follow
        view = console.is_terminal and not no_view and not output.machine
        sup = asyncio.run(follow(store, plan, view=view, console=console, duration=seconds * 2 + 30,
                                 render=table))
        report = _report(store, sup, sim, db, parquet)
        report |= _charts(store, out)
        report |= suggestions(str(db), free_port(SERVE_PORT))
    finally:
        sim.stop_thread()
        store.dispose()
    if output.machine:
        output.data(report, report["runs"])
    else:
        _print(output, report)


def hf_reference(folder: Path) -> Path:
    """The step-1 gate's HF reference CE of the arm and its control (`--reference-ce DIR`): in
    the simulation, what a correct forward of their seed's first batch gives."""
    from steptail.simcluster.trainer import Trainer

    folder.mkdir(exist_ok=True)
    for run in (ARM, CONTROL):
        (folder / f"{run}.json").write_text(json.dumps({"1": Trainer(seed=QWEN_SEED).base_ce(1)}) + "\n")
    return folder


CHARTS = ((f"{ARM}-vs-{CONTROL}.png", f"{ARM} against its control {CONTROL}"),
          ("olmo3-sft-ce.png", "olmo3-sft's CE by incarnation, across its JobSet restart"))


def _charts(store, out: Path) -> dict:
    """The two charts, and the arm's comparison with its control."""
    from steptail.storage.compare import CompareRefused, compare_runs, plot
    from steptail.storage.export import write_ce_plot

    (vs, vs_what), (ce, ce_what) = CHARTS
    charts, comparison = [], None
    try:
        result = compare_runs(store, ARM, CONTROL)
        plot(result, str(out / vs), store)
        comparison = result.summary()
        first = result.first_divergent_step
        row = next((r for r in result.rows if r["step"] == first), None)
        comparison["delta_at_first_divergent_step"] = row["delta"] if row else None
        charts.append({"path": str(out / vs), "what": vs_what})
    except CompareRefused as exc:
        charts.append({"path": None, "what": vs_what, "error": f"comparison refused: {exc}"})
    write_ce_plot(store, "olmo3-sft", out / ce)
    charts.append({"path": str(out / ce), "what": ce_what})
    return {"charts": charts, "comparison": comparison}


def steptail_command() -> str:
    """The steptail running now, as a shell word that a new shell runs without the venv on its
    PATH: this executable's absolute path (`make demo` runs .venv/bin/steptail)."""
    argv0 = Path(sys.argv[0])
    candidates = [argv0] if argv0.name == "steptail" else []
    candidates.append(Path(sys.executable).parent / "steptail")  # the venv's bin, not resolved
    candidates += [Path(found)] if (found := shutil.which("steptail")) else []
    for path in candidates:
        if path.is_file():
            return shlex.quote(str(path.absolute()))
    return shlex.join([sys.executable, "-c", "from steptail.cli import main; main()"])


def free_port(preferred: int) -> int:
    """`preferred` when nothing listens on it on 127.0.0.1, else a port free now."""
    for port in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise OSError("no free port on 127.0.0.1")


def suggestions(db: str, port: int) -> dict:
    """Commands to go on with, each ready to paste in a new shell: `try` reads the store (check
    and compare exit 1: they flag the arm; check with the HF reference the demo wrote beside
    the store), `serve` starts the web page at `url`."""
    exe, arg = steptail_command(), shlex.quote(db)  # whatever the directories are called
    reference = shlex.quote(str(Path(db).parent / REFERENCE))
    return {
        "try": [f"{exe} runs --db {arg}", f"{exe} steps olmo3-sft --db {arg}",
                f"{exe} check {ARM} --db {arg} --reference-ce {reference}",
                f"{exe} compare {ARM} {CONTROL} --db {arg}"],
        "serve": f"{exe} serve --db {arg} --port {port}",
        "url": f"http://127.0.0.1:{port}/",
    }


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
        output.print(f"{count(r['steps_recorded'], 'step')} recorded of {r['steps_written_by_trainer']} written "
                     f"({count(r['incarnations'], 'incarnation')}), {count(r['reconnects'], 'reconnect')}, "
                     f"state {r['state']}")
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
            where = (f"inc {f['incarnation']}" if f["first_step"] < 0  # not tied to a step (a runbook rule)
                     else f"inc {f['incarnation']}, steps {f['first_step']}–{f['last_step']}")
            output.print(f"  [yellow]{f['severity']}[/] {f['kind']} ({where}): {f['detail']}", highlight=False)
    if (c := report.get("comparison")) is not None:
        output.console.rule(f"[bold]{c['arm']} vs {c['control']}")
        output.print(f"{c['arm']} runs ici_context_parallelism=4 with context_parallel_load_balance=True, which "
                     f"the runbook forbids; {c['control']} is its control (same seed, data order and "
                     f"{c['process_count']}-host slice, no context parallelism).", markup=False)
        if c["first_divergent_step"] is None:
            output.print(f"within tolerance at all {c['steps_compared']} common steps", markup=False)
        else:
            first = c["delta_at_first_divergent_step"]
            at_first = "" if first is None else f" (\u0394ce {first:+.3f})"
            output.print(f"diverges at step {c['first_divergent_step']}{at_first}; max |\u0394ce| "
                         f"{c['max_abs_delta']:.3f} at step {c['max_delta_step']}", markup=False)
    output.console.rule("data")
    output.print(f"SQLite:  {report['db']}", markup=False)
    output.print(f"Parquet: {report['parquet']}", markup=False)
    for i, chart in enumerate(report.get("charts", [])):
        where = chart["path"] or f"not written: {chart['error']}"
        output.print(f"{'charts:' if i == 0 else '':9}{where}  ({chart['what']})", markup=False)
    for i, cmd in enumerate(report.get("try", [])):
        output.print(f"{'try:' if i == 0 else '':9}{cmd}", markup=False)
    if "serve" in report:
        output.print(f"{'page:':9}{report['serve']}", markup=False)
        output.print(f"{'':9}then open {report['url']}", markup=False)
