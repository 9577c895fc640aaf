"""Findings that say a check could not be evaluated for want of its input (no HF reference CE,
step 1 never recorded): they never replace a stored finding that was evaluated with it
(storage/findings.py keeps the evaluated one).

A fresh finding carries the flag in `extra`, set by its detector; a stored one (its extra is not
stored) is known by its detail's words, the ones the detectors write for it."""

from __future__ import annotations

from steptail.runs.findings import Finding

NOT_EVALUABLE = "not_evaluable"  # Finding.extra key, set by the detector
# What the detectors' details of a not-evaluated check say (runs/detectors.py `_gate`, `finish`).
MARKS = ("cannot run:", "could not run:", "not evaluable")


def mark(f: Finding | None) -> Finding | None:
    """Flag a finding just emitted as not evaluable (None passes: the finding existed)."""
    if f is not None:
        f.extra[NOT_EVALUABLE] = True
    return f


def not_evaluable(f: Finding) -> bool:
    return bool(f.extra.get(NOT_EVALUABLE)) or any(m in f.detail for m in MARKS)
