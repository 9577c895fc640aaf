"""tests/slow_tests.txt names tests that exist: a renamed or deleted test would otherwise leave
a stale line, and its successor would run in `make quick` unnoticed."""

import ast
from pathlib import Path

from conftest import SLOW

TESTS = Path(__file__).parent


def test_every_slow_entry_is_a_module_or_test_that_exists():
    stale = []
    for entry in sorted(SLOW):
        module, _, name = entry.partition("::")
        path = TESTS / module
        if not path.is_file():
            stale.append(entry)
        elif name:
            defined = {n.name for n in ast.walk(ast.parse(path.read_text()))
                       if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
            if name not in defined:
                stale.append(entry)
    assert not stale, stale
    assert len(SLOW) > 100  # the file was read at all
