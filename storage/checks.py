"""`check` of a stored run in one call: every detector over its rows (with the HF reference CE
given, stored with the run, or the one stored before), the findings stored (fresh ones, plus
live-only ones kept from `follow`; what they change kept as superseded), and whether they call
for stopping the run."""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa

from steptail.runs.detect import Settings
from steptail.runs.findings import Finding, sort_key
from steptail.runs.policy import stop_worthy
from steptail.runs.reference import Reference
from steptail.storage.db import Store
from steptail.storage.findings import evaluate_and_store
from steptail.storage.reads import known_run, run_location
from steptail.storage.run_inputs import stored_reference
from steptail.storage.superseded import load_superseded


class CheckFailed(Exception):
    """The store failed while the run was checked; the message is the driver's first line."""


@dataclass
class CheckResult:
    run: str
    findings: list[Finding]  # every finding of the run now stored, in check's order
    jobset: str | None  # where a followed run ran (None for saved logs)
    namespace: str | None
    stop: bool  # a finding says the run's loss is wrong (steptail.runs.policy)
    reference: Reference | None = None  # the HF reference CE the gate was evaluated with (given or stored)
    superseded: list[dict] = field(default_factory=list)  # the run's superseded findings, oldest first


def check_and_store(store: Store, run: str, settings: Settings | None = None,
                    reference_ce: dict[int, float] | None = None) -> CheckResult:
    """Raises UnknownRun, or CheckFailed when the store fails during the check."""
    known_run(store, run)
    try:
        with store.engine.begin() as conn:  # the reference, the findings and what they supersede: one commit
            stored = evaluate_and_store(conn, run, settings, reference_ce, by="check")
            reference = stored_reference(conn, run)
            superseded = load_superseded(conn, run)
    except sa.exc.SQLAlchemyError as exc:
        raise CheckFailed(str(getattr(exc, "orig", exc)).splitlines()[0]) from exc
    findings = sorted(stored, key=sort_key)
    jobset, namespace = run_location(store, run)
    return CheckResult(run, findings, jobset, namespace, any(stop_worthy(f) for f in findings),
                       reference, superseded)
