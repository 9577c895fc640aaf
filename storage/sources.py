"""Run identity: where a run's data comes from, and the one check that keeps two sources
from sharing a run name by accident.

A source is `kubernetes:<namespace>/<jobset>` (follow) or `files` (ingest). A run takes the
source of whoever writes it first; another source may add to it only when the caller says it
is the same run (`--append`). Without this, following a JobSet named like an earlier
file-ingested run appended to it as a new incarnation and raised false resume alerts."""

from __future__ import annotations

import time

import sqlalchemy as sa

FILES = "files"
APPEND_HINT = "pass --append if it is the same run, or --run NAME"


def kubernetes_source(namespace: str, jobset: str) -> str:
    return f"kubernetes:{namespace}/{jobset}"


def _held(source: str) -> str:
    return "ingested from files" if source == FILES else f"followed from {source}"


def _action(source: str) -> str:
    return "ingesting files" if source == FILES else f"following {source}"


class SourceConflict(Exception):
    """`incoming` would append to a run that holds data of other sources only."""

    def __init__(self, run: str, held: list[str], incoming: str) -> None:
        self.run, self.held, self.incoming = run, held, incoming
        super().__init__(f"{self.clash}: {APPEND_HINT}")

    @property
    def holds(self) -> str:
        return "holds data " + " and ".join(_held(s) for s in self.held)

    @property
    def clash(self) -> str:
        return f'run "{self.run}" {self.holds}; {_action(self.incoming)} would append to it'


def sources_of(conn: sa.Connection, run: str) -> list[str]:
    return list(conn.execute(
        sa.text("SELECT source FROM run_sources WHERE run = :run ORDER BY added_ns, source"), {"run": run}
    ).scalars())


def check_source(conn: sa.Connection, run: str, source: str, *, append: bool = False) -> None:
    """Raise SourceConflict when `run` holds data from other sources and `append` is not set.
    A run with no recorded source (new, or empty) is no conflict."""
    held = sources_of(conn, run)
    if held and source not in held and not append:
        raise SourceConflict(run, held, source)


def claim_source(conn: sa.Connection, run: str, source: str, *, append: bool = False) -> None:
    """check_source, then record `source` for `run` inside the caller's transaction (the one
    that creates the run or writes its rows: the check and the record are one step). Call it
    after the run's row was upserted: that write locks the run, so two writers claiming the
    same new run one after the other see each other's source."""
    check_source(conn, run, source, append=append)
    conn.execute(
        sa.text("INSERT INTO run_sources (run, source, added_ns) VALUES (:run, :source, :now)"
                " ON CONFLICT DO NOTHING"),
        {"run": run, "source": source, "now": time.time_ns()},
    )


def check_runs(store, runs: dict[str, str], *, append: bool = False) -> None:
    """check_source for several runs (run -> incoming source), read-only: before following starts."""
    with store.engine.connect() as conn:
        for run, source in runs.items():
            check_source(conn, run, source, append=append)
