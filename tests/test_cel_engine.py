"""runs/cel_engine.py: CEL's extension without the cel package's command line, and the package
still importable beside it (its extension initialises once per process: a second load panics)."""

import subprocess
import sys

import pytest

BOTH_ORDERS = {
    "engine first": "import sys, steptail.runs.runbook as r, cel; assert r.cel is sys.modules['cel.cel']",
    "package first": "import sys, cel, steptail.runs.runbook as r; assert r.cel is sys.modules['cel.cel']",
}


@pytest.mark.parametrize("code", BOTH_ORDERS.values(), ids=BOTH_ORDERS.keys())
def test_the_cel_package_imports_beside_the_engine(code):
    done = subprocess.run([sys.executable, "-c", code + "; print(r.cel.compile('1 + 2'), cel.compile('3'))"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-500:]
    assert 'Program("1 + 2")' in done.stdout


def test_the_engine_leaves_the_command_line_unimported():
    code = ("import sys, steptail.runs.runbook as r; r.cel.compile('1'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('cel', 'prompt_toolkit', 'typer')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.strip() == "['cel.cel']"
