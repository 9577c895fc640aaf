"""Detectors as plug-ins: one module per rule that judges a run from what the engine hands it
(runs.detectors.FindingEngine, the loop over a run's rows shared by `check`, `ingest` and
`follow`). A module subclasses `Detector`, answers the hooks it needs and is listed in
DETECTORS; a new finding kind is its constant in runs.findings, one module here and its tests.

A rule judged at every step answers `step`/`loss` row by row and `steady` for a run of steps
the engine takes at once (the bulk path: each plug-in takes them or refuses, and one refusal
sends them row by row). The engine itself finds the gaps between and before steps: a head
that was not read is what tells the other rules they could not run (`unread_head`)."""

from __future__ import annotations

from dataclasses import dataclass

from steptail.runs.detect.base import Detector, Engine, IncView
from steptail.runs.detect.load_balance import LoadBalanceRule
from steptail.runs.detect.missing_rbf import MissingRbf
from steptail.runs.detect.nonfinite_ce import NonFiniteCe
from steptail.runs.detect.resume_from_zero import ResumeFromZero
from steptail.runs.detect.resume_mismatch import ResumeMismatch, ResumeSettings
from steptail.runs.detect.stall import Stall, StallSettings
from steptail.runs.detect.step1_gate import GateSettings, Step1Gate
from steptail.runs.detect.step_time_regression import StepTimeRegression
from steptail.runs.findings import knobs

# In the order the engine asks them: their findings come out in it (a head that was not read:
# the gate, then the load-balance rule; at the end: REQUIRED_RBF owed, the regressions, then
# the gate).
DETECTORS: tuple[type[Detector], ...] = (Stall, MissingRbf, NonFiniteCe, ResumeMismatch, ResumeFromZero,
                                         StepTimeRegression, Step1Gate, LoadBalanceRule)



@dataclass
class Settings(ResumeSettings, GateSettings, StallSettings):  # fields in reverse: stall, gate, resume
    """The detectors' settings: each declared once, in its detector's module."""

    @classmethod
    def knobs(cls) -> list:
        """The settings a command's options set (dataclasses.Field, with flag and help)."""
        return knobs(cls)


__all__ = ["DETECTORS", "Detector", "Engine", "IncView", "Settings"]
