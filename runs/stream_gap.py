"""A stream gap: a window of one log stream whose lines are lost (rotated away between reads,
a pod deleted before its log was read to the end). The follower finds it, the sink stores it
(stream_gaps) and the detectors name it in the gap findings over that window."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


def unseen_attempt_stream(attempt: int) -> str:
    """The stream of a JobSet restart attempt whose pods ran and ended unseen (no uid known):
    its gap covers the whole attempt (collector.live.unseen_attempts)."""
    return f"restart-attempt-{attempt}"


@dataclass(slots=True)
class StreamGap:
    stream: str
    start_ns: int
    end_ns: int | None  # None: open (the stream_gaps table may hold such a row)
    reason: str
    detected_ns: int = field(default_factory=time.time_ns)

    def overlaps(self, lo: int | None, hi: int | None) -> bool:
        """Whether the gap meets the window from `lo` to `hi` (ns; unknown ends never meet)."""
        if lo is None or hi is None:
            return False
        return self.start_ns < hi and (self.end_ns is None or self.end_ns > lo)
