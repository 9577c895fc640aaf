"""Replicas of `follow` sharing one PostgreSQL store, with no service but the database.

- A replica is alive while it holds its own advisory lock (`replica_key`) on a dedicated
  connection; its row in `replicas` carries a heartbeat and how many runs it owns. A replica
  that dies closes that connection, and PostgreSQL drops every lock it held at once.
- A run is owned by the replica holding the session-level advisory lock `run_key(run)` on
  that same connection (`Leases.try_own_many`: never waits).
- Writes are fenced: a new owner bumps the run's epoch (`run_owners`) and loads the run's
  state under the run's fence lock, exclusive (`take_over`); every commit first takes that
  lock shared and then checks its epoch is still the run's (`fence`). So a
  commit in flight when ownership moves completes before the new owner reads the cursor, and
  a replica whose run was taken over (its connection, hence its lock, lost) cannot commit
  again: no step twice, none lost.

On SQLite, replicas are not possible (one writer): `SqliteFollowLock` refuses a second
`follow` on the same file."""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

from steptail.storage.db import Store

# A replica's heartbeat older than this is a replica gone without closing its connection
# cleanly (its row is removed); liveness itself is the replica lock, which falls at once.
STALE_NS = 60 * 1_000_000_000
# How long a reconnecting replica waits for its own session from before an outage to end.
STALE_LOCK_WAIT = "10s"


class NotOwner(Exception):
    """This replica no longer owns the run: its commit was refused (nothing written)."""


def _key(kind: str, name: str) -> int:
    """A signed 64-bit advisory-lock key for (kind, name); kinds never share keys."""
    digest = hashlib.blake2b(f"steptail:{kind}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def run_key(run: str) -> int:
    return _key("owner", run)


def fence_key(run: str) -> int:
    return _key("fence", run)


def replica_key(replica: str) -> int:
    return _key("replica", replica)


# Advisory locks (objsubid 1: the single-bigint form) of this database, as bigint keys.
_HELD = """
SELECT ((l.classid::bigint << 32) | l.objid::bigint) AS key, l.pid
FROM pg_locks l
WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


@dataclass(frozen=True)
class Replica:
    replica: str
    host: str
    pid: int
    backend_pid: int
    runs: int
    heartbeat_ns: int = 0  # its own clock: compared only with its own earlier beats


@dataclass(frozen=True)
class Survey:
    """One look at the fleet: the live replicas and which run keys are held by whom."""

    alive: list[Replica]
    held: dict[int, int]  # owner-lock key (signed) -> backend pid holding it
    # every replica with a row, alive or not: one whose lock fell without a close is here, one
    # that closed (a clean exit) is not
    registered: frozenset[str] = frozenset()
    # replica -> its heartbeat_ns, for every registered replica (its own clock: only compared
    # with its own earlier beats, to see how long it has stood still)
    beats: dict[str, int] = field(default_factory=dict)

    def owner_of(self, run: str) -> Replica | None:
        pid = self.held.get(run_key(run))
        return next((r for r in self.alive if r.backend_pid == pid), None) if pid is not None else None


def _signed(key: int) -> int:
    return key - (1 << 64) if key >= 1 << 63 else key


class Leases:
    """This replica's dedicated connection: its registration, heartbeat and run locks.

    Blocking (call from a worker thread); one call at a time."""

    def __init__(self, store: Store, replica: str, host: str, pid: int) -> None:
        if store.is_sqlite:
            raise ValueError("replicas share runs through PostgreSQL only")
        self.store, self.replica, self.host, self.pid = store, replica, host, pid
        self.conn: sa.Connection | None = None
        self.backend_pid = 0

    # -- connection -----------------------------------------------------------------------
    def connect(self) -> None:
        """Open the dedicated connection, take the replica lock, write the replica's row."""
        self.close()
        conn = self.store.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            self.backend_pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
            self._take_replica_lock(conn)
            now = time.time_ns()
            conn.execute(sa.text(
                "INSERT INTO replicas (replica, host, pid, backend_pid, started_ns, heartbeat_ns, runs) "
                "VALUES (:r, :h, :p, :b, :n, :n, 0) ON CONFLICT (replica) DO UPDATE SET "
                "backend_pid = excluded.backend_pid, heartbeat_ns = excluded.heartbeat_ns, runs = 0"),
                {"r": self.replica, "h": self.host[:256], "p": self.pid, "b": self.backend_pid, "n": now})
        except BaseException:
            conn.close()
            raise
        self.conn = conn

    def _take_replica_lock(self, conn: sa.Connection) -> None:
        """The replica lock. Held by another session, that is this replica's own from before
        an outage (the key is this process's alone), which the server has not ended yet (a
        partition: its connection hangs rather than closes): it is ended, and its run locks
        fall with it, so the runs followed here meanwhile can be taken back at once."""
        key = replica_key(self.replica)
        if conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar():
            return
        stale = [pid for k, pid in conn.execute(sa.text(_HELD)) if _signed(int(k)) == key]
        for pid in stale:
            conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        conn.execute(sa.text(f"SET lock_timeout = '{STALE_LOCK_WAIT}'"))
        try:
            conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": key})
        finally:
            conn.execute(sa.text("SET lock_timeout = 0"))

    def close(self) -> None:
        """Close the connection: every lock of this replica falls."""
        if self.conn is None:
            return
        conn, self.conn = self.conn, None
        try:
            conn.execute(sa.text("DELETE FROM replicas WHERE replica = :r"), {"r": self.replica})
        except sa.exc.SQLAlchemyError:
            pass  # the connection is already gone: so are the locks; the row goes stale
        finally:
            try:
                conn.invalidate()  # never back to the pool: a pooled session would keep the locks
            finally:
                conn.close()

    def _c(self) -> sa.Connection:
        if self.conn is None:
            raise NotOwner("the ownership connection is closed")
        return self.conn

    # -- the fleet ------------------------------------------------------------------------
    def heartbeat(self, owned: int) -> Survey:
        """Record this replica's heartbeat and owned count; the live replicas and held locks."""
        c = self._c()
        now = time.time_ns()
        c.execute(sa.text("UPDATE replicas SET heartbeat_ns = :n, runs = :o WHERE replica = :r"),
                  {"n": now, "o": owned, "r": self.replica})
        held = {_signed(int(k)): pid for k, pid in c.execute(sa.text(_HELD))}
        alive, stale, registered, beats = [], [], set(), {}
        for r in c.execute(sa.text(
                "SELECT replica, host, pid, backend_pid, runs, heartbeat_ns FROM replicas ORDER BY replica")):
            rep = Replica(r.replica, r.host, r.pid, r.backend_pid, r.runs, r.heartbeat_ns)
            if held.get(replica_key(rep.replica)) == rep.backend_pid:
                alive.append(rep)
            elif now - r.heartbeat_ns > STALE_NS:
                stale.append(rep.replica)
                continue
            registered.add(rep.replica)
            beats[rep.replica] = rep.heartbeat_ns
        if stale:  # gone long ago: the table stays small
            c.execute(sa.text("DELETE FROM replicas WHERE replica IN :s AND heartbeat_ns < :t")
                      .bindparams(sa.bindparam("s", expanding=True)), {"s": stale, "t": now - STALE_NS})
        return Survey(alive, held, frozenset(registered), beats)

    def end_replica(self, hung: Replica, runs: list[str]) -> int:
        """End a hung replica's sessions that matter here: its ownership connection (its run
        locks fall with it) and any session holding the fence lock of one of its runs (a
        commit frozen mid-transaction would hold up the new owner's take-over until it
        resumed). Its process, if it resumes, finds its connection gone and its runs taken.
        Returns how many sessions were ended."""
        c = self._c()
        fences = {fence_key(r) for r in runs}
        pids = {hung.backend_pid} | {pid for k, pid in c.execute(sa.text(_HELD)) if _signed(int(k)) in fences}
        pids.discard(self.backend_pid)
        return sum(_terminate(c, p) for p in pids)


    # -- runs -----------------------------------------------------------------------------
    def try_own_many(self, runs: list[str]) -> list[str]:
        """The runs of `runs` whose owner lock this call took (those nobody held), in one
        statement: a replica taking over a hundred runs does not wait a hundred round trips."""
        if not runs:
            return []
        keys = {run_key(r): r for r in runs}
        got = self._c().execute(sa.text(
            "SELECT k FROM unnest(CAST(:keys AS bigint[])) AS k WHERE pg_try_advisory_lock(k)"),
            {"keys": list(keys)}).scalars().all()
        return [keys[k] for k in got]

    def last_owners(self, runs: list[str]) -> dict[str, str]:
        """run -> the replica that followed it last (`run_owners`), for runs that have one: who
        held a run before this replica first looked (a replica just started knows no history)."""
        if not runs:
            return {}
        return dict(self._c().execute(
            sa.text("SELECT run, replica FROM run_owners WHERE run IN :runs")
            .bindparams(sa.bindparam("runs", expanding=True)), {"runs": runs}).all())

    def release(self, run: str) -> None:
        self._c().execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": run_key(run)})


# The fence lock shared (until commit: a take-over waits for this transaction), then the
# run's epoch, in two statements: under READ COMMITTED a statement reads the snapshot taken
# when it began, so an epoch read in the statement that waited for the lock would be the one
# from before a take-over that committed meanwhile — and a replica whose run was just taken
# would commit after the new owner loaded the run (tests/test_handover_fork.py).
_FENCE_LOCK = sa.text("SELECT pg_advisory_xact_lock_shared(:k)")
_EPOCH = sa.text("SELECT epoch FROM run_owners WHERE run = :r")


def fence(conn: sa.Connection, run: str, epoch: int) -> None:
    """First in a write transaction of `run`: go on only while `epoch` (this replica's, from
    `take_over`) is still the run's; NotOwner otherwise (another replica took the run over).
    The epoch is read once the lock is held, so it is the newest committed one."""
    conn.execute(_FENCE_LOCK, {"k": fence_key(run)})
    now = conn.execute(_EPOCH, {"r": run}).scalar()
    if now != epoch:
        raise NotOwner(f"{run}: taken over by another replica (epoch {now}, ours {epoch}): nothing committed")


def take_over(conn: sa.Connection, run: str, replica: str) -> tuple[str | None, int]:
    """In the new owner's load transaction, before reading the run's state: wait for a
    commit of the previous owner still in flight (the fence lock, exclusive), record this
    replica as the owner under a new epoch. Returns (the replica that owned it before, None
    on a first start; the new epoch)."""
    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": fence_key(run)})
    before = conn.execute(sa.text("SELECT replica FROM run_owners WHERE run = :r"), {"r": run}).scalar()
    epoch = conn.execute(sa.text(
        "INSERT INTO run_owners (run, replica, since_ns, epoch) VALUES (:r, :p, :n, 1) ON CONFLICT (run) "
        "DO UPDATE SET replica = excluded.replica, since_ns = excluded.since_ns, "
        "epoch = run_owners.epoch + 1 RETURNING epoch"),
        {"r": run, "p": replica, "n": time.time_ns()}).scalar_one()
    return before, epoch


class SqliteFollowLock:
    """One `follow` per SQLite file: an exclusive flock on a side file, held while following."""

    def __init__(self, database: str) -> None:
        self.path = Path(f"{database}.follow")
        self._fh = None

    def acquire(self) -> None:
        """Raises StoreBusy naming the other follower."""
        fh = open(self.path, "a+")  # noqa: SIM115 - held until release()
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            other = fh.read().strip() or "another process"
            fh.close()
            raise StoreBusy(
                f"another steptail follow ({other}) is writing to {self.path.with_suffix('')}: "
                "SQLite has one writer; run several replicas against PostgreSQL (--db postgresql://…)"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {os.uname().nodename}")
        fh.flush()
        self._fh = fh

    def release(self) -> None:
        if self._fh is not None:
            fh, self._fh = self._fh, None
            fh.close()


class StoreBusy(Exception):
    """Another follower holds this SQLite store."""


def _terminate(c: sa.Connection, pid: int) -> bool:
    """End a session and wait (up to 2 s, PostgreSQL 14+) until it is gone, its locks with it."""
    try:
        return bool(c.execute(sa.text("SELECT pg_terminate_backend(:p, 2000)"), {"p": pid}).scalar())
    except sa.exc.ProgrammingError:  # before 14: no wait; the next look sees the locks fall
        return bool(c.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar())
