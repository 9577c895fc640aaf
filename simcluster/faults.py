"""Faults the API server injects: auth lapse (401), queued failures (500/503…), RBAC denial
of pod list/watch (403), undeserializable pods, and the end of every open stream.

The workload faults (rotation, restarts, stalls, rate) live in controller.py. This is plain
state: read and changed under ClusterState.lock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class ApiFaults:
    lapse_until: float = 0.0  # time.time() before which every request gets 401
    fail_queue: list[tuple[int, str | None]] = field(default_factory=list)  # (code, path substring)
    deny_until: float = 0.0  # pod list/watch answered 403 Forbidden until then (time.time())
    deny_user: str = ""
    corrupt_until: float = 0.0  # pods in list/watch undeserializable until then
    eof_gen: int = 0  # bumped by eof_streams: a stream opened under an older value ends

    def lapsed(self) -> bool:
        return time.time() < self.lapse_until

    def take_failure(self, path: str) -> int | None:
        """The status code queued for this request, if the head of the queue matches it."""
        if self.fail_queue:
            code, sub = self.fail_queue[0]
            if sub is None or sub in path:
                self.fail_queue.pop(0)
                return code
        return None

    def denied_user(self) -> str | None:
        return self.deny_user if time.time() < self.deny_until else None

    def corrupting(self) -> bool:
        return time.time() < self.corrupt_until
