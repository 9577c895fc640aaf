"""What `steptail follow` reports about its runs: the summary at the end (each run with its
state, steps, findings and collector events; pod discovery, the ownership connection) and
failures by kind. The live table itself is the CLI's (steptail/live_view.py), built on the
same facts (run_state, findings_by_severity)."""

from __future__ import annotations

from steptail.collector.live.follower import RunStatus
from steptail.collector.notify.health import Health
from steptail.runs.findings import SEVERITIES, STALL, sort_key
from steptail.runs.state import ENDED, FAILED, LIVE, STALLED, UNKNOWN

COMPLETED = "container Completed"  # the follower's state once process 0 completed (collector.live.follower)
DETAIL_CHARS = 160  # a finding's detail in the summary's text (whole in --json)


def run_state(s: RunStatus) -> str:
    """The run's state as steptail.runs.state names it, from what the follower sees: ended once
    process 0 completed, failed while its container ended otherwise (until a restart), stalled
    while the stall finding is open (no step within k x the median step time: the engine's
    stall clock), live while steps come, unknown before the first."""
    if s.state == FAILED:  # its JobSet failed or was deleted (collector.live.run_end, --until-done)
        return FAILED
    if s.done or s.state.startswith(COMPLETED):
        return ENDED
    if s.state.startswith("container ") and s.state.endswith("; waiting"):
        return FAILED
    if s.last_step is None:
        return UNKNOWN
    if any(f.kind == STALL and f.incarnation == s.last_incarnation and f.first_step > s.last_step
           for f in list(s.findings.values())):
        return STALLED
    return LIVE


def findings_by_severity(s: RunStatus) -> dict[str, int]:
    counts = {sev: 0 for sev in SEVERITIES}
    for f in list(s.findings.values()):
        counts[f.severity] = counts.get(f.severity, 0) + 1
    return {k: n for k, n in counts.items() if n}


SHORT = {"critical": "crit", "warning": "warn"}  # the live table's narrow column


def severity_text(counts: dict[str, int], short: bool = False) -> str:
    """`2 critical, 1 warning` (most severe first; short: `2 crit, 1 warn`), or `none`."""
    return ", ".join(f"{n} {SHORT.get(sev, sev) if short else sev}" for sev, n in counts.items() if n) or "none"


def _finding(f) -> dict:
    return {"severity": f.severity, "kind": f.kind, "incarnation": f.incarnation, "steps": f.steps,
            "first_step": f.first_step, "last_step": f.last_step, "detail": f.detail}


def _findings(s: RunStatus) -> list[dict]:
    rank = {sev: i for i, sev in enumerate(SEVERITIES)}
    return [_finding(f) for f in sorted(list(s.findings.values()),
                                        key=lambda f: (rank.get(f.severity, len(rank)), *sort_key(f)))]


def summary(statuses: dict[str, RunStatus], discovery: Health | None = None,
            ownership: Health | None = None, collector_events=None) -> dict:
    """What `follow` prints at the end: each run (the follower's `state`, the run's
    `run_state`, steps, findings by severity and each finding, its collector events), pod
    discovery (and its collector events), and with replicas the ownership connection;
    failures by kind. `collector_events`: collector.notify.collector_events.CollectorEvents."""
    def events(run: str) -> list[dict]:
        if collector_events is None:
            return []
        return [e.to_dict() for e in collector_events.events if e.run == run]

    runs = [
        {"run": s.run, "jobset": s.jobset, "pod": s.pod, "state": s.state, "run_state": run_state(s),
         "incarnation": s.last_incarnation, "last_step": s.last_step, "ce": s.last_ce, "steps": s.steps,
         "lines": s.lines, "rows": s.rows, "reconnects": s.reconnects, "gaps": s.gaps, "failures": s.failures,
         "errors": dict(s.errors), "last_error": s.last_error, "findings_by_severity": findings_by_severity(s),
         "findings": _findings(s), "collector_events": events(s.run)}
        for s in statuses.values()
    ]
    report = {"runs": runs, "discovery": {**_health(discovery or Health("discovery")),
                                          "collector_events": events("")}}
    if ownership is not None:
        report["ownership"] = _health(ownership)
    return report


def _health(h: Health) -> dict:
    return {"state": h.state(), "failures": sum(h.counts.values()), "errors": dict(h.counts),
            "last_error": h.last[1] if h.last else None}


def by_kind(errors: dict[str, int]) -> str:
    """`auth ×3, network ×1` (most frequent first)."""
    return ", ".join(f"{k} ×{n}" for k, n in sorted(errors.items(), key=lambda kv: (-kv[1], kv[0])))


def short(detail: str) -> str:
    return detail if len(detail) <= DETAIL_CHARS else detail[:DETAIL_CHARS - 1] + "…"
