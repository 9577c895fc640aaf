"""A run's state, from the run itself (never from when a row was last written): one definition
for the page, `runs`, the API, the live view and the dashboards (docs/verdicts.md "Run state").

Pure: the caller gathers the facts (the store's rows, or the live follower's view)."""

from __future__ import annotations

LIVE, STALLED, ENDED, FAILED, INGESTED, UNKNOWN = "live", "stalled", "ended", "failed", "ingested", "unknown"
STATES = (LIVE, STALLED, ENDED, FAILED, INGESTED, UNKNOWN)
