"""Detector settings shared by `check` (offline) and `follow` (live): one set of options,
one set of detectors."""

from __future__ import annotations

from pathlib import Path

import click

from steptail.commands._common import fail
from steptail.runs.findings import Settings
from steptail.runs.reference import ReferenceError, load_reference, reference_for


def detector_options(fn):
    """--reference-ce, --gate-tolerance, --resume-tolerance, --stall-k."""
    for option in reversed((
        click.option("--reference-ce", metavar="VALUE|FILE|DIR",
                      help="HF reference CE of step 1, a JSON/CSV file of step -> ce, or a directory "
                           "of <run>.json / <run>.csv (one reference per run, e.g. with follow --all). "
                           "Stored with the run: later evaluations given none use it; a different one "
                           "replaces it (the old one kept as superseded)."),
        click.option("--gate-tolerance", type=float, default=1e-3, show_default=True,
                     help="Step-1 CE gate: largest allowed |ce - reference|."),
        click.option("--resume-tolerance", type=float, default=1e-4, show_default=True,
                     help="Resume mismatch: largest allowed |replayed ce - first recording|."),
        click.option("--stall-k", type=float, default=3.0, show_default=True,
                     help="Stall: no step for longer than k x the median step time."),
    )):
        fn = option(fn)
    return fn


def detector_settings(reference_ce: str | None, gate_tolerance: float, resume_tolerance: float,
                      stall_k: float, run: str | None = None) -> tuple[Settings, dict[int, float] | Path | None]:
    """Validated Settings and reference CE, or exit 2 with a one-line reason. With `run`, the
    reference is that run's (its file of a --reference-ce directory); without, as given
    (follow picks each run's)."""
    for name, value in (("--gate-tolerance", gate_tolerance), ("--resume-tolerance", resume_tolerance),
                        ("--stall-k", stall_k)):
        if not value >= 0:
            fail(f"{name} must be a non-negative number")
    try:
        reference = load_reference(reference_ce)
        if run is not None:
            reference = reference_for(reference, run)
    except ReferenceError as exc:
        fail(str(exc))
    settings = Settings(stall_k=stall_k, gate_tolerance=gate_tolerance, resume_tolerance=resume_tolerance)
    return settings, reference

