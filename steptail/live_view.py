"""The live terminal view of `steptail follow`: one row per run (rich Live), each on one
line at any terminal width (steptail.output.fit_table: cells cut with an ellipsis, the run's
name whole, the least useful columns left out first). Log lines (failures, findings) print
above it, never inside: while rich's Live runs it redirects sys.stderr above the live region,
and the handler of steptail.logs writes to sys.stderr as it is at each record (whole lines,
through the Live's console).

Presentation, so in the CLI's layer: `collector.live.wiring.follow` is handed `table` as its
`render` (the collector never imports the CLI's output module)."""

from __future__ import annotations

import math

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from steptail.collector.live.follower import RunStatus
from steptail.collector.live.view import findings_by_severity, run_state, severity_text
from steptail.collector.notify.health import Health
from steptail.output import Column, fit_table


def _num(v, fmt: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return format(v, fmt)


def _red_if(key: str):
    return lambda r: "red" if r[key] else None


def _findings_style(r: dict) -> str | None:
    sev = r["severities"]
    return "red" if sev.get("critical") else "yellow" if sev.get("warning") else None


# Left out when the terminal is narrow, in this order: lines, step s, pod, stream gaps,
# failures and reconnects, last error (cut to 16 first). The run, its state (live, stalled,
# ended, failed, unknown: steptail.runs.state), incarnation, step, CE, steps recorded and its
# findings by severity are always there; the follower's own state is cut to 8.
COLUMNS = [
    Column("run", "run", keep=True),
    Column("pod", "pod", min_width=10, drop=3),
    Column("state", "run_state", keep=True, style=lambda r: "red" if r["run_state"] in ("stalled", "failed") else None),
    Column("follower", "state", min_width=8),
    Column("inc", "inc", keep=True),
    Column("last step", "step", keep=True),
    Column("ce", "ce", keep=True),
    Column("step s", "step_s", min_width=None, drop=4),
    Column("lines", "lines", min_width=None, drop=5),
    Column("steps", "steps", min_width=None, keep=True),
    Column("findings", "findings", keep=True, style=_findings_style),
    Column("reconnects", "reconnects", min_width=None, drop=2),
    Column("gaps", "gaps", min_width=None, drop=2, style=_red_if("gaps")),
    Column("failures", "failures", min_width=None, drop=2, style=_red_if("failures")),
    Column("last error", "last_error", min_width=16, drop=1, style=lambda r: "red" if r["last_error"] else None),
]


def rows(statuses: dict[str, RunStatus]) -> list[dict]:
    out = []
    for st in statuses.values():
        severities = findings_by_severity(st)
        out.append({"run": st.run, "pod": st.pod or "-", "run_state": run_state(st), "state": st.state,
                    "inc": _num(st.last_incarnation, "d"), "step": _num(st.last_step, "d"),
                    "ce": _num(st.last_ce, ".4f"), "step_s": _num(st.step_seconds, ".2f"), "lines": st.lines,
                    "steps": st.steps, "findings": severity_text(severities, short=True), "severities": severities,
                    "reconnects": st.reconnects, "gaps": st.gaps, "failures": st.failures,
                    "last_error": st.last_error or ""})
    return out


class View:
    """The table, laid out at the width it is drawn at (a terminal can be resized)."""

    def __init__(self, statuses: dict[str, RunStatus], discovery: Health | None = None) -> None:
        self.rows = rows(statuses)
        self.caption = None
        if discovery is not None and discovery.failing is not None:
            self.caption = Text(f"pod discovery {discovery.state()}: {discovery.failing[1]}", style="red",
                                no_wrap=True, overflow="ellipsis")  # one line too

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield fit_table(COLUMNS, self.rows, options.max_width, title="steptail follow", caption=self.caption,
                        compact=True, more="a wider terminal; the summary at the end has them")


def table(statuses: dict[str, RunStatus], discovery: Health | None = None) -> View:
    """What rich's Live shows: every run on one line (see View)."""
    return View(statuses, discovery)
