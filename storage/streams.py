"""What a follower records about its log streams, in the caller's transaction: stretches of log
that could not be read back (stream_gaps, once per start) and re-opened streams
(stream_reconnects, for the Fleet board)."""

from __future__ import annotations

from functools import cache

import sqlalchemy as sa


def record_stream_gaps(conn: sa.Connection, rows: list[tuple]) -> None:
    """rows: (run, stream, start_ns, end_ns, reason, detected_ns); a gap already stored stays."""
    conn.exec_driver_sql(_gap_sql(conn.dialect.paramstyle), rows)


def record_reconnects(conn: sa.Connection, rows: list[tuple]) -> None:
    """rows: (run, stream, ts_ns, reason)."""
    conn.exec_driver_sql(_reconnect_sql(conn.dialect.paramstyle), rows)


def _placeholders(paramstyle: str, n: int) -> str:
    return ", ".join(["?" if paramstyle == "qmark" else "%s"] * n)


@cache
def _gap_sql(paramstyle: str) -> str:
    return (f"INSERT INTO stream_gaps (run, stream, start_ns, end_ns, reason, detected_ns) VALUES "
            f"({_placeholders(paramstyle, 6)}) ON CONFLICT (run, stream, start_ns) DO NOTHING")


@cache
def _reconnect_sql(paramstyle: str) -> str:
    return f"INSERT INTO stream_reconnects (run, stream, ts_ns, reason) VALUES ({_placeholders(paramstyle, 4)})"
