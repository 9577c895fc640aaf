"""Expand Grafana's template variables and PostgreSQL macros the way Grafana does, so that
the SQL of a panel or alert rule can be run outside Grafana (tests, benchmark).

Two passes, as in Grafana: the frontend interpolates variables (`$run`, `${run}`,
`${run:sqlstring}`, `[[run]]`; the SQL datasources quote multi-value and include-all
variables as a list of literals), then the backend's macro engine replaces `$__name(args)`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

# Grafana's variable regex (public/app/features/variables/utils.ts).
_VARIABLE = re.compile(
    r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\${(\w+)(?:\.([^:^}]+))?(?::([^}]+))?}"
)
# The SQL macro engine's regex (pkg/tsdb/sqleng): $name(args).
_MACRO = re.compile(r"\$([_a-zA-Z0-9]+)\(([^)]*)\)")


class MacroError(ValueError):
    pass


@dataclass
class Variable:
    values: list[str]
    multi: bool = False
    include_all: bool = False


@dataclass
class TimeRange:
    start: datetime
    end: datetime

    @property
    def start_ns(self) -> int:
        return _ns(self.start)

    @property
    def end_ns(self) -> int:
        return _ns(self.end)


@dataclass
class Context:
    time: TimeRange
    variables: dict[str, Variable] = field(default_factory=dict)
    # The panel's width in points (Grafana's maxDataPoints): sets $__interval_ms.
    max_data_points: int = 1000

    @property
    def interval_ms(self) -> int:
        """Grafana's $__interval_ms: the time range over the panel's points, at least 1 ms
        (Grafana then rounds it to a familiar step; any width serves the SQL alike)."""
        span_ms = (self.time.end_ns - self.time.start_ns) // 1_000_000
        return max(1, span_ms // max(1, self.max_data_points))


def _ns(t: datetime) -> int:
    # Grafana's time range has millisecond resolution.
    return int(round(t.timestamp() * 1000)) * 1_000_000


def quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _sql_default(var: Variable) -> str:
    # grafana-postgresql-datasource's interpolateVariable.
    if len(var.values) == 1 and not (var.multi or var.include_all):
        return var.values[0].replace("'", "''")
    return ",".join(quote_literal(v) for v in var.values)


def _format(var: Variable, fmt: str | None) -> str:
    if fmt is None:
        return _sql_default(var)
    if fmt == "sqlstring":
        return ",".join(quote_literal(v) for v in var.values)
    if fmt == "csv":
        return ",".join(var.values)
    if fmt == "raw":
        return ",".join(var.values)
    if fmt == "singlequote":
        return ",".join("'" + v.replace("'", "\\'") + "'" for v in var.values)
    if fmt == "doublequote":
        return ",".join('"' + v.replace('"', '\\"') + '"' for v in var.values)
    raise MacroError(f"unsupported variable format {fmt!r}")


def interpolate(sql: str, variables: dict[str, Variable]) -> str:
    def repl(m: re.Match) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        fmt = m.group(3) or m.group(6)
        var = variables.get(name)
        if var is None:
            return m.group(0)  # not a variable (e.g. a macro): left for the backend
        return _format(var, fmt)

    return _VARIABLE.sub(repl, sql)


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def expand_macros(sql: str, time: TimeRange) -> str:
    def repl(m: re.Match) -> str:
        name, raw = m.group(1), m.group(2)
        args = [a.strip() for a in raw.split(",")] if raw.strip() else []
        match name:
            case "__time":
                return f'{args[0]} AS "time"'
            case "__timeEpoch":
                return f'extract(epoch from {args[0]}) AS "time"'
            case "__timeFilter":
                return f"{args[0]} BETWEEN '{_iso(time.start)}' AND '{_iso(time.end)}'"
            case "__timeFrom":
                return f"'{_iso(time.start)}'"
            case "__timeTo":
                return f"'{_iso(time.end)}'"
            case "__unixEpochFilter":
                return (f"{args[0]} >= {int(time.start.timestamp())} AND "
                        f"{args[0]} <= {int(time.end.timestamp())}")
            case "__unixEpochFrom":
                return str(int(time.start.timestamp()))
            case "__unixEpochTo":
                return str(int(time.end.timestamp()))
            case "__unixEpochNanoFilter":
                return f"{args[0]} >= {time.start_ns} AND {args[0]} <= {time.end_ns}"
            case "__unixEpochNanoFrom":
                return str(time.start_ns)
            case "__unixEpochNanoTo":
                return str(time.end_ns)
        raise MacroError(f"undefined macro: ${name}")

    return _MACRO.sub(repl, sql)


def expand(sql: str, ctx: Context) -> str:
    builtins = {"__interval_ms": Variable([str(ctx.interval_ms)]),
                "__interval": Variable([f"{ctx.interval_ms}ms"])}
    return expand_macros(interpolate(sql, builtins | ctx.variables), ctx.time)
