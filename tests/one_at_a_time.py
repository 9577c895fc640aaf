"""Tests marked `one_at_a_time` never run two at once across pytest-xdist workers
(tests/conftest.py); every other test runs beside them as usual. An exclusive flock on a file
in the session's temporary directory, which the workers share."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def one_at_a_time(folder: Path) -> Iterator[None]:
    with open(folder / "one_at_a_time.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
