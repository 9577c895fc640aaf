"""Opening the SQL store: URL resolution, engine set-up, automatic migration, reflected tables.

The schema comes from the Alembic migrations alone; tables are reflected after upgrading."""

from __future__ import annotations

import fcntl
import os
import sqlite3
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError

DEFAULT_DB = "steptail.db"
# The newest migration. Checked against Alembic's own view in tests; lets a store that is
# already current open without importing Alembic (a third of a second on every command).
SCHEMA_HEAD = "0015"
MIGRATIONS = Path(__file__).parent / "migrations"
_LOCK_ID = 0x5717A11  # PostgreSQL advisory lock serialising concurrent first-use upgrades


class StoreError(Exception):
    """The store cannot be used; the message is one line, safe to show (no password)."""


# How an open store fails, named for the layers above (they import no SQLAlchemy): any failure,
# and one of the database or its driver (a full disk, a lost connection).
StoreFailure = SQLAlchemyError
DatabaseFailure = DBAPIError


@dataclass
class Store:
    engine: Engine
    tables: dict[str, sa.Table]

    @property
    def placeholder(self) -> str:
        return "?" if self.engine.dialect.paramstyle == "qmark" else "%s"

    @property
    def is_sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    def describe(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def catalog_url(self) -> str:
        """The lake's catalog (storage.lake) lives in this database: its URL, password included
        (handed to the catalog's engine, never logged)."""
        return self.engine.url.render_as_string(hide_password=False)

    def dispose(self) -> None:
        self.engine.dispose()


def resolve_url(db: str | None) -> sa.URL:
    """--db value (URL or SQLite path), else $STEPTAIL_DB, else ./steptail.db."""
    # stripped: a URL kept in a Secret file often ends with a newline
    raw = (db or os.environ.get("STEPTAIL_DB") or DEFAULT_DB).strip()
    if "://" not in raw:
        return make_url(f"sqlite:///{Path(raw).expanduser().absolute()}")
    try:
        url = make_url(raw)
    except ArgumentError:
        raise StoreError("bad database URL (expected e.g. postgresql://host/db or a file path)") from None
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    if url.get_backend_name() not in ("sqlite", "postgresql"):
        raise StoreError(f"unsupported database {url.get_backend_name()!r}: use SQLite or PostgreSQL")
    return url


def open_store(db: str | None = None, *, create: bool = True) -> Store:
    """Connect, upgrade the schema to the newest migration, reflect the tables."""
    url = resolve_url(db)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        path = Path(url.database)
        if not create and not path.exists():
            raise StoreError(f"no database at {path} (ingest or follow a run first, or pass --db)")
        if not path.parent.is_dir():
            raise StoreError(f"directory {path.parent} does not exist")
    try:
        engine = _engine(url)
        if not _is_current(engine):  # a current schema is only read: no lock (nor lock file) needed
            with _sqlite_lock(url), engine.begin() as conn:
                _upgrade(conn)
        meta = sa.MetaData()
        meta.reflect(engine)
    except NoSuchModuleError:
        raise StoreError(f"no driver for {url.drivername!r}") from None
    except SQLAlchemyError as exc:
        safe = url.render_as_string(hide_password=True)
        raise StoreError(f"cannot use database {safe}: {failure_reason(exc)}") from None
    return Store(engine, dict(meta.tables))


def failure_reason(exc: BaseException) -> str:
    """The driver's own words for a database error, one line (SQLAlchemy's text adds the
    statement and its parameters)."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextmanager
def _sqlite_lock(url: sa.URL):
    """Serialise first-use upgrades of one SQLite file across processes (PostgreSQL uses an
    advisory lock). The flock is on a side file: closing any descriptor of the database file
    itself would drop the POSIX locks SQLite holds on it in this process (a reader elsewhere
    could then checkpoint and unlink the WAL under a live writer)."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        yield
        return
    try:
        handle = open(f"{url.database}.lock", "ab")  # noqa: SIM115 - closed by the with below
    except OSError as exc:  # a read-only directory: SQLite could not write its WAL there either
        safe = url.render_as_string(hide_password=True)
        raise StoreError(f"cannot use database {safe}: cannot write in {Path(url.database).parent}: "
                         f"{exc.strerror or exc}") from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def sqlite_file(db: str | None) -> Path | None:
    """The file of a SQLite store (None for PostgreSQL, memory, or a URL that does not parse)."""
    try:
        url = resolve_url(db)
    except StoreError:
        return None
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database)


def remove_unused_store(path: Path) -> bool:
    """Remove a SQLite store a command created and then wrote nothing into (its schema only),
    with its lock file. Kept when it holds a run, or when another process has it open (its WAL
    index is there: SQLite removes it when the last connection closes). Never raises."""
    lock = Path(f"{path}.lock")
    if not path.exists() or not lock.exists():  # nothing made (nor anything to make here)
        return False
    try:
        with open(lock, "ab") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # no first-use upgrade runs meanwhile
            if _in_use(path):
                return False
            with closing(sqlite3.connect(f"file:{path}?mode=rw", uri=True)) as conn:
                if conn.execute("SELECT EXISTS (SELECT 1 FROM runs)").fetchone()[0]:
                    return False
            if _in_use(path):  # opened by another process since
                return False
            path.unlink()
            lock.unlink()  # while held: a process waiting on it creates its store afresh
            return True
    except (OSError, sqlite3.Error):
        return False


def _in_use(path: Path) -> bool:
    return Path(f"{path}-shm").exists() or Path(f"{path}-wal").exists()


def _engine(url: sa.URL) -> Engine:
    if url.get_backend_name() == "sqlite":
        engine = sa.create_engine(url, connect_args={"timeout": 30})

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record) -> None:  # WAL: readers never block the writer
            cur = dbapi_conn.cursor()
            # Large pages: per-step rows arrive in key order, and a 64 KiB page cuts the cost
            # of writing them by a third (takes effect only when the file is created).
            cur.execute("PRAGMA page_size=65536")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    # TCP keepalives and a user timeout on the client's side too: a server gone without a
    # close (a failover moving its address, a partition) fails the connection within about
    # 15 s, and the commit is retried on a new one, instead of hanging for the kernel's hours.
    return sa.create_engine(url, pool_pre_ping=True, connect_args={
        "connect_timeout": 10, "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
        "keepalives_count": 3, "tcp_user_timeout": 15000})


def _is_current(engine: Engine) -> bool:
    with engine.connect() as conn:
        return _current_revision(conn) == SCHEMA_HEAD


def _current_revision(conn: sa.Connection) -> str | None:
    if not sa.inspect(conn).has_table("alembic_version"):
        return None
    return conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()


def _upgrade(conn: sa.Connection) -> None:
    if _current_revision(conn) == SCHEMA_HEAD:
        return
    # alembic loads only when a schema is created or upgraded: opening a current store stays fast
    from alembic import command
    from alembic.config import Config

    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_ID})
        if _current_revision(conn) == SCHEMA_HEAD:
            return
    elif not conn.connection.dbapi_connection.in_transaction:
        # pysqlite begins a transaction only before INSERT/UPDATE/DELETE: each CREATE TABLE
        # would commit alone, and a failure half-way (a full disk) would leave a schema that
        # no later upgrade can complete ("table runs already exists"). All revisions run in
        # this one transaction instead (SQLite DDL is transactional).
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, "head")


def migration_head() -> str:
    """Alembic's head revision, read from the migration scripts."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(cfg).get_current_head()
