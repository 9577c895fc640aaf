"""Which runs this replica of `follow` follows, when several share one PostgreSQL store.

Every `INTERVAL` the replica beats its heart (storage.replicas.Leases) and looks at the fleet:
the live replicas and which runs are held. Then (`plan_moves`, pure):

- it takes runs nobody holds, up to its fair share (ceil(runs / live replicas)); a run left
  unheld for `GRACE` is taken whatever the share (availability before balance);
- it gives back runs above its share while another live replica is below it (one handover
  each, exact: the run is flushed and committed before its lock is released), never one it
  took in the last SETTLE_AFTER_TAKE (a run taken over is being recovered);
- a run it believed it held but whose lock it no longer has is lost (its connection dropped):
  the Supervisor stops it at once, without a commit (the fence would refuse one);
- a run whose lock fell without its holder letting it go (the holder's connection ended, its
  row still there) is taken only after `HANDOVER_WAIT`: a holder whose session alone was ended
  reconnects at its next look and takes its locks back, and is not followed twice meanwhile;
- a replica whose heartbeat stands still for `HUNG_AFTER` (a frozen process, a node paused)
  is ended (`Leases.end_replica`): its runs are taken at once rather than when it resumes.

The connection failing (a store outage) loses no run: they read on and buffer (RunSink), and
`reconnect` takes their locks back; only a run another replica holds by then is lost.

A replica killed outright closes its connection; PostgreSQL drops its locks, and the others
take its runs at their next look (well within 10 s). A replica cut off without a close (a
lost node) is found by the server's TCP keepalives (`KEEPALIVES`), a hung one is ended after
`IDLE_TIMEOUT` without a heartbeat."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import sqlalchemy as sa

from steptail.collector.live.read_gate import ReadGate
from steptail.storage.db import Store
from steptail.storage.replicas import Leases, NotOwner, Replica, Survey, run_key

log = logging.getLogger("steptail.replicas")

INTERVAL = 0.5  # seconds between looks at the fleet (a heartbeat: three small statements)
GRACE = 3.0  # a run unheld this long is taken regardless of the fair share
# A run whose holder's lock fell unannounced waits this long for the holder to take it back:
# more than its next look (INTERVAL) and a reconnect.
HANDOVER_WAIT = 2.0
HUNG_AFTER = 5.0  # a live replica's heartbeat unchanged this long (seen looking steadily): ended
# a hung replica ended here is remembered this long (its runs taken without HANDOVER_WAIT);
# by then it has resumed and re-registered, or its row is gone
ENDED_MEMORY = 60.0
COOLDOWN = 10.0  # a run given back is not taken again by the same replica for this long
# a run taken is not given back for balance sooner than this: a run just taken over is being
# recovered (re-read from its committed cursor, a rotation may be near); handing it on at once
# (a replica restarting nearby) stopped that read for the next owner's look and lock (seed 26)
SETTLE_AFTER_TAKE = 5.0
# A replica cut off without a close (a lost node) is found by the server's TCP keepalives
# (about 4 + 2 x 2 s); one whose process hangs is ended after IDLE_TIMEOUT without a heartbeat.
KEEPALIVES = {"tcp_keepalives_idle": 4, "tcp_keepalives_interval": 2, "tcp_keepalives_count": 2}
IDLE_TIMEOUT = "30s"
OUTAGE_RETRY_MAX = 5.0  # seconds between tries to reconnect during a store outage, at most
LOOK_TIMEOUT = 10.0  # a look (or a reconnect) without an answer this long: the connection fails


def replica_id() -> str:
    """Unique per process: the pod name (hostname) and pid, and a nonce for pid reuse."""
    return f"{socket.gethostname()[:80]}-{os.getpid()}-{secrets.token_hex(2)}"


@dataclass
class Moves:
    take: list[str] = field(default_factory=list)  # try to lock these (unheld)
    give: list[str] = field(default_factory=list)  # hand these over (above the fair share)
    lost: list[str] = field(default_factory=list)  # no longer held: stop without a commit


def fair_share(runs: int, replicas: int) -> int:
    return math.ceil(runs / max(1, replicas))


def _rank(my_pid: int, run: str) -> bytes:
    return hashlib.blake2b(f"{my_pid}:{run}".encode(), digest_size=4).digest()


def plan_moves(candidates: Iterable[str], owned: set[str], survey: Survey, my_pid: int,
               unheld_since: dict[str, float], cooling: dict[str, float], now: float,
               fell: Iterable[str] = (), taken_at: dict[str, float] | None = None) -> Moves:
    """What to do after one look at the fleet (no I/O). `unheld_since` is kept up to date
    here (run -> when first seen unheld); `cooling` maps a run given back to its end of
    cooldown; `fell`: runs whose holder lost its lock without letting go (`fallen`), or a
    mapping of them to how long their holder's heartbeat has been seen standing still (a
    holder silent for HANDOVER_WAIT is not taking its lock back: a replica that starts late,
    or learns of the run late, need not wait again);
    `taken_at`: when this replica took each run it holds (none is given back within
    SETTLE_AFTER_TAKE of that)."""
    fell = dict(fell) if isinstance(fell, dict) else dict.fromkeys(fell, 0.0)
    candidates = sorted(set(candidates))
    moves = Moves()
    for run in sorted(owned):
        if survey.held.get(run_key(run)) != my_pid:
            moves.lost.append(run)
    kept = owned.difference(moves.lost)
    share = fair_share(len(candidates), len(survey.alive))
    free = []
    for run in candidates:
        if run in kept:
            continue
        if run_key(run) in survey.held:
            unheld_since.pop(run, None)
            continue
        free.append(run)
        unheld_since.setdefault(run, now)
    room = share - len(kept)
    # the longest unheld first; among equals, an order of this replica's own, so replicas
    # starting together do not all reach for the same runs
    for run in sorted(free, key=lambda r: (unheld_since[r], _rank(my_pid, r))):
        waited = now - unheld_since[run]
        if cooling.get(run, 0.0) > now and waited < 2 * GRACE:
            continue  # given back a moment ago: another replica is meant to take it
        if run in fell and max(waited, fell[run]) < HANDOVER_WAIT:
            continue  # its holder may only have lost its session: it takes the lock back
        if room > 0 or waited >= GRACE:
            moves.take.append(run)
            room -= 1
    others = [r.runs for r in survey.alive if r.backend_pid != my_pid]
    if len(kept) > share and others and min(others) < share and not free:
        below = sum(max(0, share - n) for n in others)
        settled = [r for r in sorted(kept) if now - (taken_at or {}).get(r, -math.inf) >= SETTLE_AFTER_TAKE]
        moves.give = settled[: min(len(kept) - share, below)]
    return moves


def fallen(candidates: Iterable[str], survey: Survey, holders: dict[str, tuple[str, int | None]],
           ended: Iterable[str] = ()) -> set[str]:
    """The unheld runs whose last holder (`holders`: run -> (replica, backend pid) when last
    seen held; pid None: known only from `run_owners`) did not let them go: it is still
    registered and not the same live session that held them (a release), nor a hung replica
    ended here (it cannot take them back). A holder known without its session counts as
    fallen only while it is not alive."""
    ended = set(ended)
    live = {r.replica: r.backend_pid for r in survey.alive}
    out = set()
    for run in candidates:
        if run_key(run) in survey.held or run not in holders:
            continue
        name, pid = holders[run]
        if name not in survey.registered or name in ended:
            continue
        if (name not in live) if pid is None else (live.get(name) != pid):
            out.add(run)
    return out


class Beats:
    """Which live replicas' heartbeats stand still: each replica's last beat and since when
    (this replica's monotonic clock) it has been seen unchanged. Counted only across looks
    that follow each other closely: after a pause of this replica's own (a store outage, a
    freeze) every clock starts again, so nobody is taken for hung for this replica's gap."""

    def __init__(self, hung_after: float = HUNG_AFTER) -> None:
        self.hung_after = hung_after
        self.seen: dict[str, tuple[int, float]] = {}  # replica -> (heartbeat_ns, unchanged since)
        self.last_look = -math.inf

    def hung(self, survey: Survey, me: int, now: float) -> list[Replica]:
        """The live replicas (not `me`) whose heartbeat stood still for hung_after; every
        registered replica's beat is kept (quiet)."""
        if now - self.last_look > 4 * INTERVAL:
            self.seen.clear()
        self.last_look = now
        beats = {**survey.beats, **{r.replica: r.heartbeat_ns for r in survey.alive}}
        for name in list(self.seen):
            if name not in beats:
                del self.seen[name]
        for name, beat in beats.items():
            if self.seen.get(name, (None,))[0] != beat:
                self.seen[name] = (beat, now)
        return [r for r in survey.alive if r.backend_pid != me and now - self.seen[r.replica][1] >= self.hung_after]

    def quiet(self, replica: str, now: float) -> float:
        """How long `replica`'s heartbeat has been seen standing still here (0: not seen)."""
        return now - self.seen[replica][1] if replica in self.seen else 0.0


class Ownership:
    """The replica's leases, driven from the event loop (the SQL runs on one worker thread)."""

    def __init__(self, store: Store, replica: str | None = None) -> None:
        self.replica = replica or replica_id()
        self.leases = Leases(store, self.replica, socket.gethostname(), os.getpid())
        self.owned: set[str] = set()
        self.unheld_since: dict[str, float] = {}
        self.cooling: dict[str, float] = {}
        self.taken_at: dict[str, float] = {}  # run -> when this replica took it (plan_moves)
        self.survey: Survey | None = None
        # run -> (replica, backend pid) last seen holding it; (replica, None): from run_owners;
        # ("", None): held by nobody before
        self.holders: dict[str, tuple[str, int | None]] = {}
        self.beats = Beats()
        self.ended: dict[str, float] = {}  # hung replicas ended here -> when
        # its own thread: a heartbeat never waits behind the runs' commits in the default pool
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ownership")
        self.failing: str | None = None
        self.gate = ReadGate()  # after a pause, reads wait for the next look (collector.live.read_gate)

    @property
    def backend_pid(self) -> int:
        return self.leases.backend_pid

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def connect(self) -> None:
        await self._call(self._connect)

    def _connect(self) -> None:
        self.leases.connect()
        try:  # a replica that vanishes without closing its connection is ended by the server
            self.leases.conn.execute(sa.text(f"SET idle_session_timeout = '{IDLE_TIMEOUT}'"))
        except sa.exc.SQLAlchemyError:  # before PostgreSQL 14: TCP keepalives only
            log.debug("idle_session_timeout not supported by this server")
        for name, value in KEEPALIVES.items():
            self.leases.conn.execute(sa.text(f"SET {name} = {int(value)}"))

    async def look(self, candidates: Iterable[str]) -> Moves:
        """Heartbeat, survey, and the moves to make; locks for `take` are tried here (the
        returned `take` lists only runs now held)."""
        candidates = list(candidates)
        survey = self.survey = await self._call(self.leases.heartbeat, len(self.owned))
        now = time.monotonic()
        for hung in self.beats.hung(survey, self.backend_pid, now):
            await self._end(hung, survey, candidates, now)
        survey = self.survey
        unknown = []
        for run in candidates:
            owner = survey.owner_of(run)
            if owner is not None:
                self.holders[run] = (owner.replica, owner.backend_pid)
            elif run not in self.holders and run_key(run) not in survey.held:
                unknown.append(run)
        if unknown:  # never seen held (this replica just started): who followed them last
            last = await self._call(self.leases.last_owners, unknown)
            for run in unknown:
                self.holders[run] = (last[run], None) if run in last else ("", None)
        for name, when in list(self.ended.items()):
            if now - when > ENDED_MEMORY:
                del self.ended[name]
        fell = {run: self.beats.quiet(self.holders[run][0], now)
                for run in fallen(candidates, survey, self.holders, self.ended)}
        moves = plan_moves(candidates, self.owned, survey, self.backend_pid, self.unheld_since,
                           self.cooling, now, fell, self.taken_at)
        got = await self._call(self.leases.try_own_many, moves.take)
        for run in got:
            self.unheld_since.pop(run, None)
            self.taken_at[run] = now
        moves.take = got
        self.owned.update(got)
        self.owned.difference_update(moves.lost)
        for run, until in list(self.cooling.items()):
            if until <= now:
                del self.cooling[run]
        return moves

    async def _end(self, hung: Replica, survey: Survey, candidates: list[str], now: float) -> None:
        """A live replica whose heartbeat stood still for HUNG_AFTER: its sessions ended, its
        runs free now (a fresh survey), taken without HANDOVER_WAIT."""
        runs = [r for r in candidates if survey.held.get(run_key(r)) == hung.backend_pid]
        ended = await self._call(self.leases.end_replica, hung, runs)
        self.ended[hung.replica] = now
        self.beats.seen.pop(hung.replica, None)
        log.warning("replica %s (host %s, pid %d) gave no heartbeat for %.0f s: ended its %d sessions, "
                    "its %d runs are taken over", hung.replica, hung.host, hung.pid, self.beats.hung_after,
                    ended, len(runs))
        self.survey = await self._call(self.leases.heartbeat, len(self.owned))

    async def reconnect(self) -> list[str]:
        """After the connection failed (its locks fell with it): connect again and take back
        the locks of the runs followed here meanwhile. Returns the runs another replica holds
        now (lost here); the others stay owned. Whether a run's epoch is still ours is the
        fence's to say, at its next commit."""
        await self.connect()
        mine = sorted(self.owned)
        got = set(await self._call(self.leases.try_own_many, mine))
        taken = [r for r in mine if r not in got]
        self.owned = got
        if taken:
            log.warning("%d runs followed here were taken by another replica during the outage: %s",
                        len(taken), ", ".join(taken[:10]))
        return taken

    async def drop(self, run: str) -> None:
        """A run lost (another replica took it, or its commit was refused): no longer ours,
        its lock let go if this connection still holds it."""
        self.owned.discard(run)
        self.taken_at.pop(run, None)
        try:
            await self._call(self.leases.release, run)
        except (sa.exc.SQLAlchemyError, NotOwner) as exc:  # the connection is gone: so is the lock
            log.debug("release of %s: %s", run, exc)

    async def release(self, run: str) -> None:
        """Give a run back (after its final commit)."""
        self.owned.discard(run)
        self.taken_at.pop(run, None)
        self.cooling[run] = time.monotonic() + COOLDOWN
        try:
            await self._call(self.leases.release, run)
        except sa.exc.SQLAlchemyError as exc:  # the connection is gone: so is the lock
            log.debug("release of %s: %s", run, exc)

    async def close(self) -> None:
        try:
            await self._call(self.leases.close)
        finally:
            self.owned.clear()
            self._thread.shutdown(wait=False)

    def __repr__(self) -> str:
        return f"Ownership({self.replica}, {len(self.owned)} runs)"
