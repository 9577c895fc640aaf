"""Detectors as plug-ins: one module per rule that judges a run from what the engine hands it
(runs.detectors.FindingEngine, the loop over a run's rows shared by `check`, `ingest` and
`follow`). A module subclasses `Detector`, answers the hooks it needs and is listed in
DETECTORS; a new finding kind is its constant in runs.findings, one module here and its tests.

The detectors of every step (gaps, stalls, non-finite CE, resume mismatches, missing
REQUIRED_RBF) stay in the engine: its bulk path judges a steady run of steps for all of them
at once, so none of them can be judged apart without giving that up."""

from __future__ import annotations

from steptail.runs.detect.base import Detector, Engine, IncView
from steptail.runs.detect.load_balance import LoadBalanceRule
from steptail.runs.detect.resume_from_zero import ResumeFromZero
from steptail.runs.detect.step1_gate import Step1Gate
from steptail.runs.detect.step_time_regression import StepTimeRegression

# In the order the engine asks them: their findings come out in it (a head that was not read:
# the gate, then the load-balance rule; at the end: the regressions, then the gate).
DETECTORS: tuple[type[Detector], ...] = (ResumeFromZero, StepTimeRegression, Step1Gate, LoadBalanceRule)

__all__ = ["DETECTORS", "Detector", "Engine", "IncView"]
