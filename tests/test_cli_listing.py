"""`steptail --help` lists every command with its line from steptail.cli.COMMANDS, without
importing any of them (all sixteen took 2.3 s), and each command still has its own help."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from steptail.cli import COMMANDS, main

LISTING = """
import sys
sys.argv = ["steptail", "--help"]
from steptail.cli import main
try:
    main()
except SystemExit:
    pass
print("LOADED", sorted(m for m in sys.modules if m.startswith("steptail.commands.")))
"""


def test_the_listing_imports_no_command_and_shows_each_line():
    out = subprocess.run([sys.executable, "-c", LISTING], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip().splitlines()[-1] == "LOADED []"
    listing = " ".join(out[out.index("Commands:"):].split())
    for name, (_, line) in COMMANDS.items():
        assert f"{name} {line}" in listing, name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_loads_with_its_line_and_its_own_help(name):
    command = main.get_command(None, name)
    assert command is not None and command.short_help == COMMANDS[name][1]
    result = CliRunner().invoke(main, [name, "--help"])
    assert result.exit_code == 0 and f"Usage: main {name}" in result.output, result.output
    assert len(COMMANDS[name][1]) <= 66  # one line beside the longest name at 80 columns
