"""A new pod's log read while an older pod of the run is still being drained.

Lines go to the run model in order: an old pod (a JobSet restart's, being deleted) is read
to its end before its replacement. When that drain keeps failing (a burst of 503s), the new
pod used to wait, unread, for as long as the old one's grace period: a rotation of the new
pod's log meanwhile took its lines (issue 33). So the new pod is read at once (a follow read
of its log) and its lines are held here; the follower feeds them after the old pod is
done, then follows the new pod from where they end (the cursor drops the overlap).

Only lines: no parsing, no store. Bounded: past MAX_BYTES (or a line over kubectl's reader
limit) reading stops, and what follows is read from the pod afterwards as usual."""

from __future__ import annotations

import asyncio
import contextlib

from steptail.collector.cluster import kubectl

MAX_BYTES = 64 << 20  # lines held at most (a grace period of a chatty pod is a few MB)
# a read the API refused is tried again after RETRY_START_S, doubling up to RETRY_MAX_S (the
# follower's RUNNING_RETRY_S: the new pod runs, and its lines can rotate away)
RETRY_START_S = 0.25
RETRY_MAX_S = 1.0
RETRIED = (kubectl.SERVER_ERROR, kubectl.NETWORK, kubectl.AUTH)


class Prefetch:
    def __init__(self, key: str, argv: list[str], env: dict[str, str]) -> None:
        self.key = key  # the stream read (follower.stream_key)
        self.lines: list[bytes] = []
        self.bytes = 0
        self.stopped_early = False  # bound reached or a line too long: the rest is read later
        self.retries = 0  # reads the API refused before a line came, tried again
        self._task = asyncio.create_task(self._read(argv, env), name=f"prefetch {key}")

    async def _read(self, argv: list[str], env: dict[str, str]) -> None:
        # A read the API refused before any line came (kubectl exits 1 on a bare 503, and on
        # auth or network failures) is tried again, backing off like the follower while the pod
        # runs: a refused prefetch that simply ended kept the new pod unread until the old one
        # was drained or gone, and the 503s left queued made that the rest of the run (issue 33,
        # chaos seed 403). Once lines came, an ended read is kept: the follower reads on from them.
        delay = RETRY_START_S
        while True:
            code, err = await self._read_once(argv, env)
            if self.lines or self.stopped_early or code in (0, None):
                return
            if kubectl.classify(err)[0] not in RETRIED:
                return  # the pod's own answer (not found, not running...): the follower's read decides
            self.retries += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    async def _read_once(self, argv: list[str], env: dict[str, str]) -> tuple[int | None, str]:
        """One follow read into `lines`: (exit code, stderr); code None when stopped early."""
        proc = await kubectl.spawn(argv, env)
        err_task = asyncio.create_task(proc.stderr.read())
        try:
            while True:
                try:
                    line = await proc.stdout.readline()
                except ValueError:  # a line over the reader's limit: the follower's own read handles it
                    self.stopped_early = True
                    return None, ""
                if not line:
                    break  # the container ended or kubectl failed: what came is held
                self.lines.append(line)
                self.bytes += len(line)
                if self.bytes >= MAX_BYTES:
                    self.stopped_early = True
                    return None, ""
        finally:
            await kubectl.stop(proc)
            if not err_task.done():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await asyncio.shield(err_task)
            if not err_task.done():
                err_task.cancel()
        err = err_task.result().decode("utf-8", "replace") if err_task.done() and not err_task.cancelled() else ""
        return proc.returncode, err

    async def take(self) -> list[bytes]:
        """Stop reading; the lines read so far, in order."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        return self.lines

    def cancel(self) -> None:
        self._task.cancel()
