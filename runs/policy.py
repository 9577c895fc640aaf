"""When a run should be stopped: findings that mean its loss is wrong. steptail only says so
(and prints the command); stopping a run is the operator's act."""

from __future__ import annotations

from steptail.runs.findings import CRITICAL, NONFINITE_CE, RESUME_MISMATCH, STEP1_CE_GATE, Finding

# A failed step-1 CE gate is critical; one that could not run (no reference) is only a warning.
STOP_KINDS = (RESUME_MISMATCH, NONFINITE_CE)


def stop_worthy(f: Finding) -> bool:
    return f.kind in STOP_KINDS or (f.kind == STEP1_CE_GATE and f.severity == CRITICAL)


def stop_command(workload: str, namespace: str) -> str:
    """Printed, never executed: steptail is read-only on the cluster."""
    return (f"kubectl patch workloads.kueue.x-k8s.io {workload} -n {namespace} --type=merge "
            "-p '{\"spec\":{\"active\":false}}'")
