"""Answers of a run's routes kept by their ETag, so a run that did not change since is answered
with the bytes made last time: the run's state (one small query) instead of its rows.

The tag is made of the run's state as read before the body (routes/steps.py), so a new commit is a
new tag and an old body is never served for it; old bodies just age out. Bounded in bytes
(least recently used out first); a body larger than a tenth of the bound is not kept."""

from __future__ import annotations

import threading
from collections import OrderedDict

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

MAX_BYTES = 64 << 20  # ~200 pages of 1,000 steps (a page of the 20,000-step benchmark run is 315 kB)


class BodyCache:
    """Thread-safe LRU of (route, tag) -> body bytes, at most `max_bytes` in all."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes, self.max_body = max_bytes, max_bytes // 10
        self.hits = self.misses = 0
        self._bodies: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, route: str, tag: str) -> bytes | None:
        with self._lock:
            body = self._bodies.get((route, tag))
            if body is None:
                self.misses += 1
                return None
            self._bodies.move_to_end((route, tag))
            self.hits += 1
            return body

    def put(self, route: str, tag: str, body: bytes) -> None:
        if len(body) > self.max_body:
            return
        with self._lock:
            old = self._bodies.pop((route, tag), None)
            self._bytes += len(body) - (len(old) if old is not None else 0)
            self._bodies[(route, tag)] = body
            while self._bytes > self.max_bytes:
                _, dropped = self._bodies.popitem(last=False)
                self._bytes -= len(dropped)

    def kept(self, route: str, tag: str, make) -> bytes | None:
        """The body kept for (route, tag), else `make()`'s, kept (None: nothing to keep)."""
        body = self.get(route, tag)
        if body is None:
            body = make()
            if body is not None:
                self.put(route, tag, body)
        return body

    @property
    def size(self) -> int:
        """Bytes held."""
        return self._bytes


class BodyCacheCollector:
    """How often a run's answer came from the body cache, and what it holds."""

    def __init__(self, cache: BodyCache) -> None:
        self.cache = cache

    def collect(self):
        answers = CounterMetricFamily("steptail_serve_cached_answers", "Run answers (steps pages, outlines) "
                                      "made, or taken from the cache of unchanged runs", labels=["cache"])
        answers.add_metric(["hit"], self.cache.hits)
        answers.add_metric(["miss"], self.cache.misses)
        held = GaugeMetricFamily("steptail_serve_cache_bytes", "Bytes of answers held for unchanged runs")
        held.add_metric([], self.cache.size)
        yield from (answers, held)
