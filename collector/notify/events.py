"""What `follow -o ndjson` streams: one dict per thing that happened, built where it happens
(rows committed, a stream gap committed, a finding committed, a follower's state changed)
and handed to Plan.on_event. Nothing is built when no one listens (the hook is None).

Step and rbf events carry the fields of `steps --json` (plus run), so a line from the stream
and a row read back later compare equal."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from steptail.parsers.timestamps import format_ns
from steptail.runs.rows import LOSS_PARTS, REQUIRED_RBF

log = logging.getLogger("steptail.follow")
Hook = Callable[[dict], None]


def emit(hook: Hook | None, event: dict) -> None:
    """A failing listener (a closed pipe, a bug) must not stop following."""
    if hook is None:
        return
    try:
        hook(event)
    except Exception as exc:  # noqa: BLE001
        log.warning("event listener failed: %s", exc)


def _ts(ts_ns: int | None) -> str | None:
    return None if ts_ns is None else format_ns(ts_ns)


def _json(value):
    return json.loads(value) if isinstance(value, str) else value


def committed_rows(hook: Hook | None, batch) -> None:
    """LOSS-PARTS rows as `step` events, REQUIRED_RBF rows as `rbf` events."""
    if hook is None:
        return
    lp, rbf = LOSS_PARTS, REQUIRED_RBF
    for row in batch.loss_parts:
        parts = row[lp.PARTS]
        emit(hook, {"event": "step", "run": row[lp.RUN], "incarnation": row[lp.INCARNATION], "step": row[lp.STEP],
                    "ts": _ts(row[lp.TS_NS]), "ce": row[lp.CE], "ce_raw": row[lp.CE_RAW],
                    "parts": _json(parts) if parts is not None else {}})
    for row in batch.required_rbf:
        emit(hook, {"event": "rbf", "run": row[rbf.RUN], "incarnation": row[rbf.INCARNATION], "step": row[rbf.STEP],
                    "ts": _ts(row[rbf.TS_NS]), "rbf_max": row[rbf.MAX], "rbf_per_layer": _json(row[rbf.PER_LAYER]),
                    "rbf_program": row[rbf.PROGRAM]})


def committed_gaps(hook: Hook | None, run: str, gaps) -> None:
    for g in gaps if hook is not None else ():
        emit(hook, {"event": "gap", "run": run, "stream": g.stream, "start": _ts(g.start_ns),
                    "end": _ts(g.end_ns), "reason": g.reason, "start_ns": g.start_ns, "end_ns": g.end_ns})


def committed_findings(hook: Hook | None, findings) -> None:
    for f in findings if hook is not None else ():
        emit(hook, {"event": "finding", **f.to_event()})


def state_changed(hook: Hook | None, run: str, state: str, pod: str | None) -> None:
    if hook is not None:
        emit(hook, {"event": "state", "run": run, "state": state, "pod": pod, "time": format_ns(time.time_ns())})
