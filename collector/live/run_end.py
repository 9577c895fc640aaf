"""What `follow` tells the store of each run it follows, for the run's state
(steptail.runs.state): a heartbeat ("followed now", runs.followed_ns, every HEARTBEAT_S) and
the end it saw (runs.outcome): process 0 completed or the JobSet Completed -> `completed`; the
JobSet Failed (terminalState or condition), or deleted before it completed -> `failed`.

The JobSets' changes are taken as they come (ClusterObjects.on_change, chained after the
runbook's): a JobSet failed and reaped at once is seen failing even when no look fell
between the two events.

With --until-done a run whose JobSet failed is done once there is nothing left to read: the
JobSet deleted, or its process-0 logs read to their end with no archive still running. Its
follower is stopped there and the run's last line says whether its pod logs were archived or
not saved (`logs_not_saved`). Without this, a failed and deleted JobSet was waited for
forever (issue 34 row 7).

Called from the Supervisor's loop (tick, every pass); the store writes run in a thread; a
failing write is a log line when it starts and when it clears, never the run's end."""

from __future__ import annotations

import asyncio
import logging
import time

from steptail.collector.cluster.jobsets import jobset_failed
from steptail.collector.live.stream_lines import stream_key
from steptail.runs.state import COMPLETED, FAILED, HEARTBEAT_S, JOBSET_FAILED
from steptail.storage import run_outcome
from steptail.storage.run_files import ARCHIVE_MANIFEST, run_files

log = logging.getLogger("steptail.follow")
RETRY_BEAT_S = 1.0  # a followed run with nothing committed yet: its first beat tried again this soon


def _terminal(obj: dict) -> str | None:
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    if jobset_failed(obj):
        return JOBSET_FAILED
    if status.get("terminalState") == "Completed" or any(
            isinstance(c, dict) and c.get("type") == "Completed" and c.get("status") == "True"
            for c in status.get("conditions") or []):
        return COMPLETED
    return None


class RunEnds:
    def __init__(self, supervisor) -> None:
        self.sup = supervisor
        self.recorded: dict[str, tuple[str, str]] = {}  # run -> (outcome, reason) stored
        self.terminal: dict[str, str] = {}  # jobset -> COMPLETED or JOBSET_FAILED, as last seen
        self.deleted: set[str] = set()  # JobSets seen deleted (and not created again since)
        self._chained = None  # the on_change we wrapped (the runbook's)
        self.done_failed: set[str] = set()  # runs --until-done ended as failed
        self._beat_at = 0.0
        self.beaten: set[str] = set()  # runs whose row took a heartbeat (a row exists)
        self._writing: asyncio.Task | None = None
        self._failing: str | None = None  # the store write failing now (said when it starts and clears)

    def _watch(self) -> None:
        """Every JobSet change told to us too (the runbook sets its own on_change first)."""
        objects = self.sup.objects
        if objects is None or objects.on_change == self._changed:
            return
        self._chained = objects.on_change
        objects.on_change = self._changed

    def _changed(self, kind: str, name: str, deleted: bool) -> None:
        if kind == "jobsets":
            obj = None if deleted else self.sup.objects.jobsets.get(name)
            if deleted:
                self.deleted.add(name)
            elif obj is not None:
                self.deleted.discard(name)
                terminal = _terminal(obj)
                if terminal is not None:
                    self.terminal[name] = terminal
                else:
                    self.terminal.pop(name, None)
        if self._chained is not None:
            self._chained(kind, name, deleted)

    async def tick(self) -> None:
        """One look: the runs' ends from the JobSets and followers, and the heartbeat due."""
        self._watch()
        if self._writing is not None and not self._writing.done():
            return  # the store is slow: one write at a time, the next look catches up
        todo = self._ends()
        followed = [r for r, t in self.sup.tasks.items() if not t.done()]
        # every HEARTBEAT_S; sooner (RETRY_BEAT_S) for a run followed here never marked yet
        due = HEARTBEAT_S if self.beaten.issuperset(followed) else RETRY_BEAT_S
        if followed and time.monotonic() - self._beat_at >= due:
            self._beat_at = time.monotonic()
        else:
            followed = []
        if todo or followed:
            self._writing = asyncio.create_task(asyncio.to_thread(self._write, todo, followed))
            await asyncio.wait([self._writing], timeout=0.0)

    async def close(self) -> None:
        """The last ends written (a run that ended just before shutdown); a run ended as
        failed keeps that state (its follower may have said something else on its way out)."""
        for run in self.done_failed:
            self.sup._set_state(run, FAILED)  # the run state's name: the live view shows it as is
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)
        todo = self._ends()
        if todo:
            await asyncio.to_thread(self._write, todo, [])

    # -- what ended --------------------------------------------------------------------------
    def _ends(self) -> list[tuple[str, str, str]]:
        sup, out = self.sup, []
        for run, status in sup.status.items():
            jobset = status.jobset
            outcome, gone = self.terminal.get(jobset), jobset in self.deleted
            if status.state == "done" and outcome is None:
                outcome, reason = COMPLETED, "process 0 completed"
            elif outcome == COMPLETED:
                reason = f"JobSet {jobset} completed"
            elif outcome == JOBSET_FAILED:
                reason = f"JobSet {jobset} failed" + (" and was deleted" if gone else "")
            elif gone:  # deleted before it completed: it will not go on
                outcome, reason = JOBSET_FAILED, f"JobSet {jobset} was deleted before it completed"
            else:
                continue
            if outcome == JOBSET_FAILED:
                reason += "; " + self._logs(jobset, run)
            self._until_done(run, jobset, status, outcome, reason)
            if self.recorded.get(run) != (outcome, reason):
                self.recorded[run] = (outcome, reason)
                out.append((run, outcome, reason))
        return out

    def _logs(self, jobset: str, run: str) -> str:
        """Whether the failed JobSet's pod logs were saved (the runbook's rule)."""
        rb = self.sup.runbook
        st = rb.states.get(jobset) if rb is not None else None
        if st is not None and st.archived:
            return "its pod logs were archived"
        if st is not None and st.archiving is not None and not st.archiving.done():
            return "its pod logs are being archived"
        if jobset in self.deleted:
            return "its pod logs were not saved (logs_not_saved)"
        return "its pod logs are not archived yet (steptail archive --jobset " + jobset + ")"

    def _until_done(self, run: str, jobset: str, status, outcome: str, reason: str) -> None:
        """--until-done: a run whose JobSet ended is done once nothing is left to read or
        archive (its JobSet deleted; or failed, read to the end, no archive running)."""
        sup = self.sup
        if not sup.plan.config.until_done or status.done:
            return
        follower = sup.followers.get(run)
        rb = sup.runbook
        st = rb.states.get(jobset) if rb is not None else None
        archiving = st is not None and st.archiving is not None and not st.archiving.done()
        read_out = follower is not None and bool(follower.known) and all(
            stream_key(p, p.restart_count) in follower.lines.finished for p in follower.known.values())
        if jobset in self.deleted or (outcome == JOBSET_FAILED and read_out and not archiving):
            status.done = True  # the follower's loop ends at its next pass; the supervisor then stops it
            if outcome == COMPLETED:
                sup._set_state(run, "done")
                return
            self.done_failed.add(run)
            sup._set_state(run, FAILED)  # the run state's name: the live view shows it as is
            log.warning("%s: run failed (%s)", run, reason)

    # -- the store ---------------------------------------------------------------------------
    def _write(self, ends: list[tuple[str, str, str]], followed: list[str]) -> None:
        store = self.sup.store
        try:
            now = time.time_ns()
            for run, outcome, reason in ends:
                if outcome == JOBSET_FAILED and "not saved" not in reason and _archived(store, run):
                    reason = reason.split("; ")[0] + "; its pod logs were archived"
                if run_outcome.record(store, run, outcome, reason, now) is None:
                    self.recorded.pop(run, None)  # no row yet (nothing committed): the next look writes it
                    continue
                log.info("%s: recorded as %s: %s", run, "ended" if outcome == COMPLETED else "failed", reason)
            self.beaten |= run_outcome.heartbeat(store, followed, now)
        except Exception as exc:  # noqa: BLE001 - retried at the next look; the runs go on
            for run, *_ in ends:
                self.recorded.pop(run, None)
            why = str(exc).splitlines()[0][:200] if str(exc) else repr(exc)
            if self._failing is None:
                log.warning("run state: cannot write the runs' ends and heartbeat: %s (retried)", why)
            self._failing = why
            return
        if self._failing is not None:
            log.info("run state: the runs' ends and heartbeat are written again")
            self._failing = None


def _archived(store, run: str) -> bool:
    try:
        with store.engine.connect() as conn:
            return bool(run_files(conn, run, ARCHIVE_MANIFEST))
    except Exception:  # noqa: BLE001 - unknown: the reason keeps what was seen live
        return False
