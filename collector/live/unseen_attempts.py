"""JobSet restart attempts that ran and ended while the collector could not see them.

Every pod a JobSet creates carries its restart attempt (jobset.sigs.k8s.io/restart-attempt);
a restart deletes the attempt's pods before creating the next attempt's. A run whose pods show
attempt A with no pod of A-1 ever seen lost A-1's log entirely: no uid, so no stream to find a
gap in (chaos seed 196: attempt 1 lived and was deleted while 502s refused every pod list)."""

from __future__ import annotations

from collections.abc import Iterable

from steptail.collector.cluster.discovery import PodInfo


def unseen_attempts(seen: Iterable[tuple[int, int | None]], pod: PodInfo,
                    blind_since_ns: int | None) -> tuple[range, int | None]:
    """The restart attempts before `pod`'s (seen now for the first time) that ran unseen, and
    since when they could have run unseen (ns; None: not known).

    `seen`: (attempt, creation ns) of each pod of the run seen before. With a lower attempt
    among them, every attempt between it and `pod`'s was created after it was seen, while the
    collector ran. With none, only the attempt right before `pod`'s is taken to have lived
    unseen, and only when `pod` was created after `blind_since_ns`: the start of the latest span
    in which pods could not be listed (collector.cluster.discovery; None: there was none). A
    restart deletes an attempt's pods before it creates the next's: the attempt before lived
    into that span — or ended before the collector started, when the span is its start-up (a
    JobSet requeued by Kueue between its attempts, say), which pods cannot tell apart. A
    creationTimestamp is whole seconds: a pod created in the second the span began is not
    taken to be after it."""
    attempts = dict(seen)
    if pod.attempt == 0 or pod.attempt in attempts or pod.attempt - 1 in attempts:
        return range(0), None
    lower = [a for a in attempts if a < pod.attempt]
    if lower:
        last = max(lower)
        return range(last + 1, pod.attempt), attempts[last]
    if blind_since_ns is not None and pod.created_ns is not None and pod.created_ns > blind_since_ns:
        return range(pod.attempt - 1, pod.attempt), blind_since_ns
    return range(0), None
