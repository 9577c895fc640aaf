"""Kubelet timestamps: RFC3339Nano, fraction of 0-9 digits with trailing zeros dropped."""

from __future__ import annotations

import calendar
import re
from datetime import UTC, datetime
from functools import lru_cache

from steptail.parsers.bounds import INT64_MAX, INT64_MIN

# A kubelet timestamp opens the line when `--timestamps` was given; a space follows it.
TS_PREFIX = re.compile(
    rb"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d) "
)


@lru_cache(maxsize=4096)
def _epoch_seconds(whole: bytes, zone: bytes) -> int:
    secs = calendar.timegm(datetime.strptime(whole.decode(), "%Y-%m-%dT%H:%M:%S").timetuple())
    if zone != b"Z":
        sign = 1 if zone[:1] == b"+" else -1
        secs -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return secs


def split_timestamp(line: bytes) -> tuple[int | None, str | None, bytes]:
    """(ns since epoch, timestamp text, rest of line); (None, None, line) when there is none."""
    if not line[:1].isdigit():
        return None, None, line
    m = TS_PREFIX.match(line)
    if m is None:
        return None, None, line
    try:
        secs = _epoch_seconds(m.group(1), m.group(3))
    except ValueError:  # e.g. month 13: not a timestamp after all
        return None, None, line
    frac = m.group(2) or b""
    ns = secs * 1_000_000_000 + (int(frac.ljust(9, b"0")) if frac else 0)
    if not INT64_MIN <= ns <= INT64_MAX:  # before 1678 or after 2262: kept a BIGINT, read as a clock jump
        ns = min(max(ns, INT64_MIN), INT64_MAX)
    return ns, line[: m.end() - 1].decode(), line[m.end() :]


def format_ns(ns: int) -> str:
    """RFC3339Nano as kubelet prints it: UTC, `Z`, trailing zeros of the fraction dropped."""
    secs, frac = divmod(ns, 1_000_000_000)
    whole = datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if frac:
        return f"{whole}.{frac:09d}".rstrip("0") + "Z"
    return whole + "Z"


def parse_rfc3339(text: str) -> int:
    """ns since epoch of an RFC3339 timestamp (raises ValueError)."""
    ns, _, rest = split_timestamp(text.encode() + b" ")
    if ns is None or rest:
        raise ValueError(f"not an RFC3339 timestamp: {text!r}")
    return ns
