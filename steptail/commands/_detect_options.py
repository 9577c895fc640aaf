"""Detector settings shared by `check`, `ingest`, `reparse`, `archive` (offline) and `follow`
(live): one set of options, made from runs.detect.Settings (each knob's default and help
declared there, once), handed to the command as one `Detection`."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import click

from steptail.commands._common import fail
from steptail.runs.detect import Settings
from steptail.runs.reference import ReferenceError, load_reference, reference_for

REFERENCE_HELP = ("HF reference CE of step 1, a JSON/CSV file of step -> ce, or a directory of <run>.json / "
                  "<run>.csv (one reference per run, e.g. with follow --all). Stored with the run: later "
                  "evaluations given none use it; a different one replaces it (the old one kept as superseded).")


@dataclass(frozen=True)
class Detection:
    """What the detector options said, as given: `resolve` validates them."""

    reference_ce: str | None = None
    knobs: dict = field(default_factory=dict)  # Settings field name -> value

    def resolve(self, run: str | None = None) -> tuple[Settings, dict[int, float] | Path | None]:
        """Validated Settings and reference CE, or exit 2 with a one-line reason. With `run`,
        the reference is that run's (its file of a --reference-ce directory); without, as given
        (follow picks each run's)."""
        for knob in Settings.knobs():
            value = self.knobs.get(knob.name, knob.default)
            if not value >= 0:
                fail(f"{knob.metadata['flag']} must be a non-negative number")
        try:
            reference = load_reference(self.reference_ce)
            if run is not None:
                reference = reference_for(reference, run)
        except ReferenceError as exc:
            fail(str(exc))
        return Settings(**self.knobs), reference


def detector_options(fn):
    """--reference-ce and an option per Settings knob, given to `fn` as `detection=Detection`."""

    @functools.wraps(fn)
    def command(*args, **kwargs):
        knobs = {k.name: kwargs.pop(k.name) for k in Settings.knobs()}
        return fn(*args, detection=Detection(kwargs.pop("reference_ce"), knobs), **kwargs)

    options = [click.option("--reference-ce", metavar="VALUE|FILE|DIR", help=REFERENCE_HELP)]
    options += [click.option(k.metadata["flag"], k.name, type=float, default=k.default, show_default=True,
                             help=k.metadata["help"]) for k in Settings.knobs()]
    for option in reversed(options):
        command = option(command)
    return command
