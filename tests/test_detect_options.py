"""The detector options: made from runs.detect.Settings, so each knob's default and help are
declared once and every command that runs the detectors offers the same ones."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from steptail.commands._detect_options import Detection
from steptail.runs.detect import Settings

COMMANDS = ("check", "ingest", "reparse", "archive", "follow")
STEPTAIL = str(Path(sys.executable).parent / "steptail")


@pytest.mark.parametrize("name", COMMANDS)
def test_every_detecting_command_offers_each_knob_with_its_one_default(name):
    params = {p.name: p for p in importlib.import_module(f"steptail.commands.{name}").command.params}
    assert "detection" not in params and "reference_ce" in params
    for knob in Settings.knobs():
        option = params[knob.name]
        assert option.opts == [knob.metadata["flag"]]
        assert option.default == knob.default and option.help == knob.metadata["help"]


def test_the_knobs_become_one_settings_object():
    settings, reference = Detection("3.25", {"stall_k": 7.0, "gate_tolerance": 0.5, "resume_tolerance": 0.0}).resolve()
    assert settings == Settings(stall_k=7.0, gate_tolerance=0.5, resume_tolerance=0.0)
    assert reference == {1: 3.25}
    assert Detection().resolve() == (Settings(), None)  # defaults: the dataclass's


@pytest.mark.parametrize("flag", [k.metadata["flag"] for k in Settings.knobs()])
def test_a_negative_knob_is_one_line_and_exit_2_before_anything(tmp_path, flag):
    db = tmp_path / "s.db"
    r = subprocess.run([STEPTAIL, "check", "r", "--db", f"sqlite:///{db}", flag, "-1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"steptail: error: {flag} must be a non-negative number"]
    assert not db.exists()
