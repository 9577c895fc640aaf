"""The live path's one event channel. Each event is emitted once, where it happens: a batch of
rows or stream gaps committed (collector.live.sink), findings committed (collector.live.detect),
a run's state changed (collector.live.follower.RunStatus), a collector event started, cleared
or found to have lost steps (collector.notify.collector_events, told by each source's Health).
Whoever needs one subscribes to its type: `follow -o ndjson` (collector.notify.events), the
alerts (a log line, a metric and the webhooks per finding: collector.notify.alerts).

Emitted from the event loop and from the commit threads: a listener must be quick and
thread-safe. One that raises is logged and skipped: it costs its own output, never the run's."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger("steptail.follow")

E = TypeVar("E")


@dataclass(frozen=True)
class RowsCommitted:
    run: str
    batch: Any  # runs.model.Batch


@dataclass(frozen=True)
class GapsCommitted:
    run: str
    gaps: list  # runs.stream_gap.StreamGap


@dataclass(frozen=True)
class FindingsCommitted:
    run: str
    findings: list  # runs.findings.Finding, new or grown


@dataclass(frozen=True)
class StateChanged:
    run: str
    state: str
    pod: str | None


@dataclass(frozen=True)
class CollectorEventTold:
    event: dict  # storage.collector_events.as_dict: kind, run, started, cleared, lost_steps…


class Channel:
    def __init__(self) -> None:
        self._listeners: dict[type, list[Callable[[Any], None]]] = {}

    def subscribe(self, kind: type[E], listener: Callable[[E], None]) -> None:
        self._listeners.setdefault(kind, []).append(listener)

    def listens(self, kind: type) -> bool:
        """Whether anyone listens to `kind` (a source may skip building what nobody reads)."""
        return bool(self._listeners.get(kind))

    def emit(self, event: object) -> None:
        for listener in self._listeners.get(type(event), ()):
            try:
                listener(event)
            except Exception as exc:  # noqa: BLE001 - a listener's failure is its own
                log.warning("%s listener failed: %s", type(event).__name__, exc)
