"""Findings: detectors over a run's records (one incremental engine for `check` and `follow`)
and their storage."""

from steptail.findings.engine import FindingEngine
from steptail.findings.model import CRITICAL, KINDS, LIVE_KINDS, WARNING, Finding, Settings
from steptail.findings.reference import ReferenceError, load_reference, reference_for
from steptail.findings.store import (
    check_run,
    load_engine,
    load_findings,
    replay,
    save_findings,
    sync_findings,
)

__all__ = [
    "CRITICAL", "KINDS", "LIVE_KINDS", "WARNING", "Finding", "FindingEngine", "ReferenceError",
    "Settings", "check_run", "load_engine", "load_findings", "load_reference", "reference_for", "replay",
    "save_findings", "sync_findings",
]
