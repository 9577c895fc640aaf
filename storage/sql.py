"""SQL sink: bulk, idempotent writes of a model Batch, and loading a run's state back.

Rows go through the driver's executemany (no ORM objects, no per-row dicts): that is what
keeps a 400 MB ingest within a few times grep. `ON CONFLICT DO NOTHING` makes every write
idempotent on both SQLite and PostgreSQL.

A row the store refuses (a value a column cannot hold: the parser's bounds should have kept
it out) costs only itself: the rows are written again in halves, each in a savepoint, down
to the refused rows, which go to the `quarantine` table with the store's reason."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from itertools import chain

import sqlalchemy as sa

from steptail.runs.cursor import Cursor
from steptail.runs.identities import IDENTITY_TABLES, Identities
from steptail.runs.model import (
    BAD_LINE,
    Batch,
    Incarnation,
    RunModel,
    planned_steps,
    quarantine_row,
)
from steptail.runs.rows import COLUMNS, FLAGS, INCARNATIONS, QUARANTINE
from steptail.storage import goodput
from steptail.storage.db import Store
from steptail.storage.reads import json_value
from steptail.storage.sources import claim_source
from steptail.storage.summary import after_write, before_write

# The columns of the model's row tuples (steptail.runs.rows, where the rows are defined) are
# the tables' columns: COLUMNS per table, and these.
INCARNATION_COLUMNS, QUARANTINE_COLUMNS, FLAG_COLUMNS = INCARNATIONS, QUARANTINE, FLAGS
log = logging.getLogger("steptail.store")


def refused_row(exc: BaseException) -> bool:
    """Whether a failed write is its rows' fault (a value the store cannot hold), not the
    store's (a lost connection, a full disk, a lock): only then are the rows split."""
    if isinstance(exc, (sa.exc.DataError, sa.exc.IntegrityError)):
        return True
    if isinstance(exc, sa.exc.DBAPIError):
        return False
    # The driver refusing a value before sending it (SQLite: an int beyond 64 bits).
    return isinstance(exc, (sa.exc.StatementError, OverflowError, ValueError, TypeError))


def _reason(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0][:500] if text else type(exc).__name__


# Rows per INSERT statement for bulk writes: one statement step per MULTI rows instead of one
# per row cuts SQLite's per-row cost by about a third. Each step also gives the GIL up and
# waits for it again (up to the switch interval while another thread runs Python): the rows
# go in statements of MULTI rows, then one each of the powers of two below it, so that a
# batch of a few thousand rows per table is ~10 steps, not ~30 of 256 rows. Every size is one
# statement text, prepared once per connection. Capped by SQLite's 32766 parameters.
MULTI = 4096
MAX_PARAMS = 32766
# PostgreSQL: from this many rows, COPY (straight into the table, or once it met a stored row
# into a staging table and one INSERT … SELECT … ON CONFLICT DO NOTHING from it: as idempotent
# as the INSERT): about half the client's work of the INSERTs, and a few round trips per
# batch; below it (the live path's batches) INSERTs.
COPY_MIN = 1000
UNIQUE_VIOLATION = "23505"  # PostgreSQL's SQLSTATE


def _insert_sql(store: Store, table: str, columns: tuple[str, ...], conflict: str, rows: int = 1) -> str:
    ph = "(" + ", ".join([store.placeholder] * len(columns)) + ")"
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES {', '.join([ph] * rows)} {conflict}"


def _chunks(largest: int) -> list[int]:
    """`largest`, then the powers of two below it, down to 1."""
    return [largest] + [1 << k for k in reversed(range(largest.bit_length())) if 1 << k < largest]


class SqlSink:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._staged: set[str] = set()  # tables whose COPY met a stored row: staged from then on
        # table -> ((rows per statement, its SQL), ...), largest first
        self._chunk_sql = {
            t: tuple((n, _insert_sql(store, t, cols, "ON CONFLICT DO NOTHING", n))
                     for n in _chunks(min(MULTI, MAX_PARAMS // len(cols))))
            for t, cols in COLUMNS.items()
        }
        updates = ", ".join(f"{c} = excluded.{c}" for c in INCARNATION_COLUMNS[2:])
        self._incarnation_sql = _insert_sql(
            store, "incarnations", INCARNATION_COLUMNS,
            f"ON CONFLICT (run, incarnation) DO UPDATE SET {updates}",
        )
        self._cursor_sql = _insert_sql(
            store, "cursors", ("run", "stream", "hwm_ns", "at_hwm", "updated_ns", "done"),
            "ON CONFLICT (run, stream) DO UPDATE SET hwm_ns = excluded.hwm_ns, "
            "at_hwm = excluded.at_hwm, updated_ns = excluded.updated_ns, done = excluded.done",
        )
        self._run_sql = _insert_sql(
            store, "runs", ("run", "jobset", "namespace", "created_ns", "updated_ns"),
            "ON CONFLICT (run) DO UPDATE SET updated_ns = excluded.updated_ns, "
            "jobset = COALESCE(excluded.jobset, runs.jobset), "
            "namespace = COALESCE(excluded.namespace, runs.namespace)",
        )
        self._quarantine_sql = _insert_sql(store, "quarantine", QUARANTINE_COLUMNS, "ON CONFLICT (run, digest) DO NOTHING")
        self._flag_sql = _insert_sql(
            store, "findings", FLAG_COLUMNS, "ON CONFLICT (run, kind, incarnation, first_step) DO NOTHING")
        # (table, row, reason) of the rows the store refused since take_refused().
        self.refused: list[tuple[str, tuple, str]] = []

    def ensure_run(self, conn: sa.Connection, run: str, jobset: str | None = None,
                   namespace: str | None = None, *, source: str | None = None, append: bool = False) -> None:
        """Create or touch the run; with `source`, also claim the run for it (raises
        storage.sources.SourceConflict when the run holds another source's data)."""
        now = time.time_ns()
        conn.exec_driver_sql(self._run_sql, (run, jobset, namespace, now, now))
        if source is not None:
            claim_source(conn, run, source, append=append)

    def write(self, conn: sa.Connection, run: str, batch: Batch) -> list[tuple[str, tuple, str]]:
        """Write one batch inside the caller's transaction (rows, incarnations, cursors, and
        the model's quarantined rows and flags). Rows the store refuses are quarantined and
        returned (also kept in `refused`); every other row is written."""
        tables = [(table, rows) for table in COLUMNS if (rows := getattr(batch, table))]
        if batch.incarnations:
            tables.append(("incarnations", list(batch.incarnations.values())))
        refused = len(self.refused)
        counted = before_write(conn, batch.loss_parts) if batch.loss_parts else []
        fresh = goodput.before_write(conn, batch) if len(batch.loss_parts) >= goodput.gp.BLOCK else {}
        try:
            if tables:
                with self._savepoint(conn):
                    for table, rows in tables:
                        self._insert(conn, table, rows)
        except Exception as exc:
            if not refused_row(exc):
                raise
            for table, rows in tables:
                self._insert_apart(conn, table, rows)
        if counted:
            after_write(conn, counted)
        if batch.loss_parts or batch.pod_metrics or batch.checkpoints or batch.incarnations:
            # goodput kept as state at commit (docs/goodput.md); a refused row: read back, not taken
            goodput.after_write(conn, batch, fresh if len(self.refused) == refused else None)
        kept = batch.quarantine + [quarantine_row(t, row, f"store refused: {why}")
                                   for t, row, why in self.refused[refused:]]
        if kept:
            self._insert_each(conn, self._quarantine_sql, kept)
        if batch.flags:
            self._insert_each(conn, self._flag_sql, batch.flags)
        if batch.cursors:
            now = time.time_ns()
            conn.exec_driver_sql(
                self._cursor_sql,
                [(run, s, c.hwm_ns, json.dumps(sorted(c.at_hwm)), now, c.done)
                 for s, c in batch.cursors.items()],
            )
        return self.refused[refused:]

    def take_refused(self) -> list[tuple[str, tuple, str]]:
        refused, self.refused = self.refused, []
        return refused

    def _savepoint(self, conn: sa.Connection):
        # SQLite undoes just the failed statement and keeps the transaction (and pysqlite's
        # SAVEPOINT before any write would end it); PostgreSQL aborts it: a savepoint it is.
        return contextlib.nullcontext() if self.store.is_sqlite else conn.begin_nested()

    def _insert(self, conn: sa.Connection, table: str, rows: list[tuple]) -> None:
        if table == "incarnations":
            conn.exec_driver_sql(self._incarnation_sql, rows)
            return
        if len(rows) >= COPY_MIN and not self.store.is_sqlite:
            self._copy(conn, table, rows)
            return
        done = 0
        for n, sql in self._chunk_sql[table]:
            end = len(rows) - (len(rows) - done) % n
            if end == done:
                continue
            if n == 1:
                conn.exec_driver_sql(sql, rows[done:end])
            else:
                conn.exec_driver_sql(sql, [tuple(chain.from_iterable(rows[i : i + n]))
                                           for i in range(done, end, n)])
            done = end

    def _copy(self, conn: sa.Connection, table: str, rows: list[tuple]) -> None:
        """PostgreSQL: the rows COPYed straight into the table, in a savepoint; if one of them
        is there already (a unique violation undoes the whole COPY), and from then on for this
        table, COPYed into a staging table of this transaction and inserted from it with ON
        CONFLICT DO NOTHING. The straight way skips the INSERT … SELECT, most of the store's
        work on new rows. A value the store refuses fails the COPY or the INSERT as it would
        fail an INSERT (a DataError or IntegrityError: split by the caller); the caller's
        savepoint undoes the staged rows with the rest."""
        if table not in self._staged:
            try:
                with conn.begin_nested():
                    self._copy_into(conn, table, table, rows)
                return
            except sa.exc.IntegrityError as exc:
                if getattr(exc.orig, "sqlstate", None) != UNIQUE_VIOLATION:
                    raise
                self._staged.add(table)  # rows stored before: each COPY would fail the same way
        stage, cols = f"steptail_stage_{table}", ", ".join(COLUMNS[table])
        conn.exec_driver_sql(f"CREATE TEMP TABLE IF NOT EXISTS {stage} (LIKE {table}) ON COMMIT DROP")
        self._copy_into(conn, stage, table, rows)
        conn.exec_driver_sql(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {stage} ON CONFLICT DO NOTHING")
        conn.exec_driver_sql(f"TRUNCATE {stage}")

    def _copy_into(self, conn: sa.Connection, target: str, table: str, rows: list[tuple]) -> None:
        """COPY `rows` (of `table`'s columns) into `target`; the driver's errors as SQLAlchemy's."""
        sql = f"COPY {target} ({', '.join(COLUMNS[table])}) FROM STDIN"
        dbapi_conn = conn.connection.dbapi_connection
        dbapi = conn.dialect.loaded_dbapi
        try:
            with dbapi_conn.cursor() as cursor, cursor.copy(sql) as copy:
                for row in rows:
                    copy.write_row(row)
        except dbapi.Error as exc:  # the driver's own: made SQLAlchemy's, as exec_driver_sql would
            lost = conn.dialect.is_disconnect(exc, dbapi_conn, None)
            raise sa.exc.DBAPIError.instance(sql, None, exc, dbapi.Error, connection_invalidated=lost) from exc

    def _insert_apart(self, conn: sa.Connection, table: str, rows: list[tuple]) -> None:
        """After a refusal: the rows in halves, each in a savepoint, down to single rows the
        store refuses (written again where they went in before: ON CONFLICT DO NOTHING)."""
        try:
            with self._savepoint(conn):
                self._insert(conn, table, rows)
            return
        except Exception as exc:
            if not refused_row(exc):
                raise
            if len(rows) == 1:
                self.refused.append((table, rows[0], _reason(exc)))
                log.warning("store refused a %s row, quarantined: %s", table, _reason(exc))
                return
        mid = len(rows) // 2
        self._insert_apart(conn, table, rows[:mid])
        self._insert_apart(conn, table, rows[mid:])

    def _insert_each(self, conn: sa.Connection, sql: str, rows: list[tuple]) -> None:
        """Quarantine and flag rows: made to fit any store; one that still does not is logged
        and dropped rather than let it block the commit."""
        try:
            with self._savepoint(conn):
                conn.exec_driver_sql(sql, rows)
            return
        except Exception as exc:
            if not refused_row(exc):
                raise
        for row in rows:
            try:
                with self._savepoint(conn):
                    conn.exec_driver_sql(sql, row)
            except Exception as exc:
                if not refused_row(exc):
                    raise
                log.error("could not keep %r: %s", row[:6], _reason(exc))


def load_model(conn: sa.Connection, run: str) -> RunModel:
    """A RunModel positioned where the store left off: current incarnation and cursors, and
    what telling a repeat from a replay needs, as it was before the stop: the run's record
    identities (each step row's stamp; the checkpoint lines' and the incarnations' start-up
    stamps), the stream that fed the last step (saved with its cursor: a step going back on it
    is held, not taken for a restart) and the last step of the incarnation before."""
    row = conn.execute(
        sa.text(
            "SELECT incarnation, started_ns, saw_start, first_step, last_step, restored_from, process_index,"
            " process_count, pod, image, image_id, topology, hosts, container_started_ns FROM incarnations"
            " WHERE run = :run ORDER BY incarnation DESC LIMIT 1"
        ),
        {"run": run},
    ).first()
    current = None
    if row is not None:
        current = Incarnation(*row[:9], image=row[9], image_id=row[10], topology=row[11], hosts=row[12],
                              container_started_ns=row[13])
        current.saw_start = bool(current.saw_start)
        for table, attr in (("required_rbf", "last_rbf"), ("pod_metrics", "last_pod_step")):
            last = conn.execute(
                sa.text(f"SELECT MAX(step) FROM {table} WHERE run = :run AND incarnation = :inc"),
                {"run": run, "inc": current.number},
            ).scalar()
            setattr(current, attr, last)
        current.config = {
            r[0] for r in conn.execute(
                sa.text("SELECT name FROM config WHERE run = :run AND incarnation = :inc"),
                {"run": run, "inc": current.number},
            )
        }
    cursors: dict[str, Cursor] = {}
    step_stream, latest = None, None
    for stream, hwm, at, done, updated in conn.execute(
        sa.text("SELECT stream, hwm_ns, at_hwm, done, updated_ns FROM cursors WHERE run = :run"), {"run": run}
    ):
        cursor = cursors[stream] = Cursor(hwm, set(json_value(at)), bool(done))
        # the stream that fed the current incarnation's last step (the latest saved, if two say so)
        if current is not None and cursor.steps == current.number and (latest is None or (updated or 0) > latest):
            step_stream, latest = stream, updated or 0
    steps = conn.execute(
        sa.text("SELECT value FROM config WHERE run = :run AND name = 'steps' ORDER BY incarnation DESC LIMIT 1"),
        {"run": run},
    ).scalar()
    prior = None
    if current is not None:
        prior = conn.execute(
            sa.text("SELECT last_step FROM incarnations WHERE run = :run AND incarnation < :inc"
                    " AND last_step IS NOT NULL ORDER BY incarnation DESC LIMIT 1"),
            {"run": run, "inc": current.number},
        ).scalar()
    return RunModel(run, current, cursors, planned_steps=None if steps is None else planned_steps(steps),
                    identities=load_identities(conn, run), step_stream=step_stream, prior_step=prior)


def load_identities(conn: sa.Connection, run: str) -> Identities:
    """The run's record identities as the store holds them (runs.identities.Identities): every step
    row's (incarnation, step, stamp), in step order; the checkpoint lines' stamps; the start-up
    of each incarnation that read its start-up lines."""
    ids = Identities()
    for kind, table in enumerate(IDENTITY_TABLES):
        result = conn.execute(sa.text(f"SELECT incarnation, step, ts_ns FROM {table} WHERE run = :run"
                                      " AND ts_ns IS NOT NULL ORDER BY incarnation, step"), {"run": run})
        for inc, step, ts in result:
            ids.add(kind, inc, step, ts)
    for kind, step, ts in conn.execute(
            sa.text("SELECT kind, step, ts_ns FROM checkpoints WHERE run = :run AND ts_ns IS NOT NULL"), {"run": run}):
        ids.mark((kind, step, ts))
    for table, step, ts in conn.execute(
            sa.text("SELECT kind, step, ts_ns FROM quarantine WHERE run = :run AND step IS NOT NULL"
                    " AND ts_ns IS NOT NULL"), {"run": run}):
        ids.quarantine(table, step, ts)
    for digest, ts in conn.execute(  # bad lines counted before: counted once (Identities.bad)
            sa.text("SELECT digest, ts_ns FROM quarantine WHERE run = :run AND kind = :kind AND ts_ns IS NOT NULL"),
            {"run": run, "kind": BAD_LINE}):
        ids.bad(digest, ts)
    for inc, started, saw_start in conn.execute(
            sa.text("SELECT incarnation, started_ns, saw_start FROM incarnations WHERE run = :run"), {"run": run}):
        if saw_start and started is not None:
            ids.starts[inc] = started
    return ids
