"""Run names, and every other name that arrives from the cluster. A run name becomes a Parquet
partition, an export directory and a zip entry, so it must be one safe path component; a
JobSet's name (its pods' label) becomes a run name, so it is held to the same rule. Pod and
container names and uids become kubectl arguments, stream keys and archive paths: the same
characters (no leading '-' an option parser could take), up to Kubernetes' own 253."""

from __future__ import annotations

import re

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}\Z")  # DNS subdomain length, RUN_NAME's characters
SHOWN = 80  # characters of a refused name shown in a message


class RunNameError(ValueError):
    """The name is not a safe identifier; the message is one line, safe to show."""


def shown(value) -> str:
    """A refused value as one safe line: repr (escapes control characters), cut to SHOWN."""
    text = repr(value) if not isinstance(value, str) or len(value) <= SHOWN else repr(value[:SHOWN]) + "…"
    return text + (f" ({len(value)} characters)" if isinstance(value, str) and len(value) > SHOWN else "")


def escaped(text: str) -> str:
    """Text for a log line: quoted, every control and non-ASCII character escaped."""
    return ascii(text)


def printed(value) -> str:
    """A name (or text holding one) from the cluster or a manifest as a terminal line shows it:
    as is when printable, else escaped (an ANSI escape, a U+202E or a newline cannot recolour
    the terminal, reverse the text or forge a line)."""
    text = value if isinstance(value, str) else str(value)
    return text if text.isprintable() else escaped(text)


def check_run_name(run: str) -> str:
    if not isinstance(run, str) or not RUN_NAME.match(run):
        raise RunNameError(
            f"run name {shown(run)} is not a safe identifier (letters, digits, '.', '_', '-'; "
            "at most 128; starting with a letter or digit)"
        )
    return run


def check_cluster_name(kind: str, value: str) -> str:
    """A name from the Kubernetes API (kind: 'pod', 'container', 'uid', 'namespace'); else
    RunNameError with one line naming it."""
    if not isinstance(value, str) or not CLUSTER_NAME.match(value):
        raise RunNameError(f"{kind} name {shown(value)} is not a safe identifier (letters, digits, '.', '_', "
                           "'-'; at most 253; starting with a letter or digit)")
    return value
