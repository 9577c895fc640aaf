"""When a run should be stopped: findings that mean its loss is wrong, on a run whose workload
is still admitted (its state live or stalled: steptail.runs.state). steptail only says so (and
prints the command); stopping a run is the operator's act."""

from __future__ import annotations

from steptail.runs.findings import CRITICAL, NONFINITE_CE, RESUME_MISMATCH, STEP1_CE_GATE, Finding
from steptail.runs.state import ADMITTED, ENDED, FAILED, INGESTED, RunState

# A failed step-1 CE gate is critical; one that could not run (no reference) is only a warning.
STOP_KINDS = (RESUME_MISMATCH, NONFINITE_CE)


def stop_worthy(f: Finding) -> bool:
    return f.kind in STOP_KINDS or (f.kind == STEP1_CE_GATE and f.severity == CRITICAL)


def stop_command(workload: str, namespace: str) -> str:
    """Printed, never executed: steptail is read-only on the cluster."""
    return (f"kubectl patch workloads.kueue.x-k8s.io {workload} -n {namespace} --type=merge "
            "-p '{\"spec\":{\"active\":false}}'")


def stop_applies(state: RunState | None) -> bool:
    """Whether stopping can apply: the run is followed now and has not ended (live or
    stalled). An ended, failed or ingested run has nothing to stop; one no collector follows
    (unknown) is not known to be admitted: no command is printed for a guess."""
    return state is not None and state.state in ADMITTED


def nothing_to_stop(state: RunState | None) -> str:
    """Why no stop command is printed for a stop-worthy finding (stop_applies is False)."""
    if state is None:
        return "the run's state is not known: nothing to stop"
    if state.state in (ENDED, FAILED):
        return f"the run has ended ({state.state}: {state.reason}): nothing to stop"
    if state.state == INGESTED:
        return "the run was ingested from saved files: nothing to stop"
    return f"the run is not followed now ({state.reason}): check it is still running before stopping it"
