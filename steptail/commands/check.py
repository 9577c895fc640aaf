"""`steptail check RUN`: run every detector over a stored run, store the findings, report them.

Exit 0 when clean, 1 when anything is flagged, 2 on error."""

from __future__ import annotations

import sys

import click
import sqlalchemy as sa

from steptail.commands._common import count, db_option, fail, store_or_exit
from steptail.commands._detect_options import Detection, detector_options
from steptail.output import Column, Output, output_option
from steptail.runs.findings import CRITICAL, Finding, actionable, step_range
from steptail.runs.gaps import GAP, HEAD_GAP
from steptail.runs.policy import nothing_to_stop, stop_applies, stop_command
from steptail.storage.checks import CheckFailed, check_and_store
from steptail.storage.reads import UnknownRun
from steptail.storage.run_inputs import reference_document
from steptail.storage.run_outcome import run_state
from steptail.storage.superseded import superseded_event


@click.command()
@click.argument("run")
@db_option
@output_option()
@detector_options
@click.option("--workload", metavar="NAME", help="Kueue workload of the run (for the stop command).")
@click.option("-n", "--namespace", metavar="NS", help="Namespace of the workload.")
def command(run: str, db: str | None, output: Output, detection: Detection, workload: str | None,
            namespace: str | None) -> None:
    """Check RUN: gaps, stalls, non-finite CE, the step-1 CE gate, the load-balance rule,
    resumes from zero, resume mismatches, missing REQUIRED_RBF. Exit 1 if anything is flagged."""
    settings, reference = detection.resolve(run)
    store = store_or_exit(db, create=False)
    try:
        result = check_and_store(store, run, settings, reference)
    except UnknownRun as exc:
        fail(str(exc))
    except CheckFailed as exc:
        fail(f"cannot check run {run!r} in {store.describe()}: {exc}")
    findings = result.findings
    try:  # the stop command only where it applies: the run's workload still admitted
        state = run_state(store, run, k=settings.stall_k)
    except sa.exc.SQLAlchemyError as exc:
        fail(f"cannot read the state of run {run!r} in {store.describe()}: {str(exc).splitlines()[0]}")
    stop = moot = None
    if result.stop and stop_applies(state):
        stop = stop_command(workload or "WORKLOAD", namespace or result.namespace or "default")
    elif result.stop:
        moot = nothing_to_stop(state)
    if output.machine:
        records = [f.to_dict() for f in findings]
        output.data({"run": run, "state": state.to_dict() if state else None, "findings": records,
                     "stop_command": stop, "reference_ce": reference_document(result.reference),
                     "superseded": [superseded_event(r) for r in result.superseded]}, records)
    else:
        _print(output, run, findings, stop, result.jobset, workload)
        _print_inputs(output, run, result, given=reference is not None)
        if moot:
            output.line(f"A finding would call for stopping this run, but {moot}")
    sys.exit(1 if actionable(findings) else 0)


# On a terminal the finding's identity stays whole and its detail is cut (the whole detail:
# -o json, or piped); the detection time is an age.
COLUMNS = [
    Column("severity", "severity", keep=True,
           style=lambda r: "bold red" if r["severity"] == CRITICAL else "yellow"),
    Column("kind", "kind", keep=True),
    Column("inc", "incarnation", keep=True),
    Column("steps", "steps", min_width=None, drop=1),
    Column("detail", "detail", min_width=16),
    Column("detected", "detected_at", wide=True, age=True, min_width=None, drop=2),
]


def _print(output: Output, run: str, findings: list[Finding], stop: str | None, jobset: str | None,
           workload: str | None) -> None:
    if not findings:
        output.line(f"run {run}: clean")
        return
    output.table(COLUMNS, [f.to_event() | {"steps": f.steps} for f in findings], title=f"run {run}")
    critical = sum(f.severity == CRITICAL for f in findings)
    output.line(f"{count(len(findings), 'finding')}, {critical} critical")
    gaps = [f for f in findings if f.kind in (GAP, HEAD_GAP)]
    if gaps:  # what is missing, in one line: the table's details say why
        where = ", ".join(f"{step_range(f.first_step, f.last_step)} (incarnation {f.incarnation}"
                          f"{', head' if f.kind == HEAD_GAP else ''})" for f in gaps[:5])
        more = f" and {count(len(gaps) - 5, 'more gap')}" if len(gaps) > 5 else ""
        output.line(f"{count(sum(f.last_step - f.first_step + 1 for f in gaps), 'step')} missing: {where}{more}")
    if stop:
        click.echo("\nTo stop this run (the operator's decision; steptail never runs it):")
        if workload is None:
            owner = f" owned by JobSet {jobset}" if jobset else ""
            click.echo(f"  # WORKLOAD: the Kueue workload{owner} (kubectl get workloads.kueue.x-k8s.io -n NS)")
        click.echo(f"  {stop}")


def _print_inputs(output: Output, run: str, result, given: bool) -> None:
    """The stored reference the gate used when none was given, and the superseded verdicts."""
    if result.reference and not given:
        output.line(f"step-1 CE gate: HF reference stored with the run (from {result.reference.source})",
                    markup=False)
    if result.superseded:
        output.line(f"{count(len(result.superseded), 'superseded finding')} kept: steptail check {run} -o json",
                    markup=False)
