"""What `follow -o ndjson` streams: one dict per event of the live path's channel
(collector.notify.channel: rows committed, a stream gap committed, a finding committed, a
run's state changed, a collector event told), built when the event comes; `attach` subscribes
the stream's hook. Nothing is built when no one listens.

Step and rbf events carry the fields of `steps --json` (plus run), so a line from the stream
and a row read back later compare equal."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from steptail.collector.notify.channel import (
    Channel,
    CollectorEventTold,
    FindingsCommitted,
    GapsCommitted,
    RowsCommitted,
    StateChanged,
)
from steptail.parsers.timestamps import format_ns
from steptail.storage import step_columns as sc

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


def attach(channel: Channel, hook: Hook) -> None:
    """`hook` handed a dict for every event of the channel that `follow -o ndjson` streams."""
    channel.subscribe(RowsCommitted, lambda e: committed_rows(hook, e.batch))
    channel.subscribe(GapsCommitted, lambda e: committed_gaps(hook, e.run, e.gaps))
    channel.subscribe(FindingsCommitted, lambda e: committed_findings(hook, e.findings))
    channel.subscribe(StateChanged, lambda e: state_changed(hook, e.run, e.state, e.pod))
    channel.subscribe(CollectorEventTold, lambda e: emit(hook, {"event": "collector_event", **e.event}))


def committed_rows(hook: Hook | None, batch) -> None:
    """LOSS-PARTS rows as `step` events, REQUIRED_RBF rows as `rbf` events: the run, the step's
    key and its fields as `steps --json` has them (storage.step_columns)."""
    if hook is None:
        return
    for event, rows, fields in (("step", batch.loss_parts, sc.LOSS_FIELDS), ("rbf", batch.required_rbf, sc.RBF_FIELDS)):
        for row in rows:  # run, incarnation, step, ts_ns, then the table's own columns
            emit(hook, {"event": event, "run": row[0], "incarnation": row[1], "step": row[2], "ts": _ts(row[3]),
                        **sc.own(row[4:], fields)})


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
