"""Run names. A name becomes a Parquet partition, an export directory and a zip entry, so it
must be one safe path component."""

from __future__ import annotations

import re

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")


class RunNameError(ValueError):
    """The name is not a safe identifier; the message is one line, safe to show."""


def check_run_name(run: str) -> str:
    if not RUN_NAME.match(run):
        raise RunNameError(
            f"run name {run!r} is not a safe identifier (letters, digits, '.', '_', '-'; "
            "at most 128; starting with a letter or digit)"
        )
    return run
