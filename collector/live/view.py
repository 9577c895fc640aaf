"""What `steptail follow` reports about its runs: the summary at the end (each run, pod
discovery, the ownership connection) and failures by kind. The live table itself is the CLI's
(steptail/live_view.py)."""

from __future__ import annotations

from steptail.collector.live.follower import RunStatus
from steptail.collector.notify.health import Health


def summary(statuses: dict[str, RunStatus], discovery: Health | None = None,
            ownership: Health | None = None) -> dict:
    """What `follow` prints at the end: each run, pod discovery, and with replicas the
    ownership connection; failures by kind."""
    runs = [
        {"run": s.run, "jobset": s.jobset, "pod": s.pod, "state": s.state, "incarnation": s.last_incarnation,
         "last_step": s.last_step, "ce": s.last_ce, "lines": s.lines, "rows": s.rows,
         "reconnects": s.reconnects, "gaps": s.gaps, "failures": s.failures, "errors": dict(s.errors),
         "last_error": s.last_error}
        for s in statuses.values()
    ]
    report = {"runs": runs, "discovery": _health(discovery or Health("discovery"))}
    if ownership is not None:
        report["ownership"] = _health(ownership)
    return report


def _health(h: Health) -> dict:
    return {"state": h.state(), "failures": sum(h.counts.values()), "errors": dict(h.counts),
            "last_error": h.last[1] if h.last else None}


def by_kind(errors: dict[str, int]) -> str:
    """`auth ×3, network ×1` (most frequent first)."""
    return ", ".join(f"{k} ×{n}" for k, n in sorted(errors.items(), key=lambda kv: (-kv[1], kv[0])))
