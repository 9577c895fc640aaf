"""The live terminal view of `steptail follow`: one row per run (rich Live)."""

from __future__ import annotations

import math

from rich.table import Table

from steptail.collector.live.follower import RunStatus
from steptail.collector.notify.health import Health


def _num(v, fmt: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return format(v, fmt)


def table(statuses: dict[str, RunStatus], discovery: Health | None = None) -> Table:
    caption = None
    if discovery is not None and discovery.failing is not None:
        caption = f"[red]pod discovery {discovery.state()}: {discovery.failing[1]}[/]"
    t = Table(title="steptail follow", caption=caption, expand=False)
    for col in ("run", "pod", "state", "inc", "last step", "ce", "step s", "lines", "rows",
                "reconnects", "gaps", "failures", "last error"):
        t.add_column(col, overflow="fold")
    for st in statuses.values():
        t.add_row(
            st.run, st.pod or "-", st.state, _num(st.last_incarnation, "d"), _num(st.last_step, "d"),
            _num(st.last_ce, ".4f"), _num(st.step_seconds, ".2f"), str(st.lines), str(st.rows),
            str(st.reconnects), f"[red]{st.gaps}[/]" if st.gaps else "0",
            f"[red]{st.failures}[/]" if st.failures else "0", st.last_error or "",
        )
    return t


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
