"""The machine as a readers-writer lock between pytest-xdist workers (tests/conftest.py): every
test holds it shared, a test marked `alone` exclusive. flock gives no preference to a waiting
writer, so a turnstile, held while a test waits for the machine, keeps new tests from starting
until the waiting `alone` test has it."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def machine_share(folder: Path, alone: bool) -> Iterator[None]:
    with open(folder / "turnstile.lock", "a") as turnstile, open(folder / "machine.lock", "a") as machine:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)
