"""Strict JSON for every output (CLI and HTTP): nan and inf become null."""

from __future__ import annotations

import math


def strict(value):
    """`value` with every non-finite float replaced by None, through dicts, lists and tuples."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict(v) for v in value]
    return value
