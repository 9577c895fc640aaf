"""A new pod's log read while an older pod of the run is still being drained.

Lines go to the run model in order: an old pod (a JobSet restart's, being deleted) is read
to its end before its replacement. When that drain keeps failing (a burst of 503s), the new
pod used to wait, unread, for as long as the old one's grace period: a rotation of the new
pod's log meanwhile took its lines (issue 33). So the new pod is read at once with
`kubectl logs -f` and its lines are held here; the follower feeds them after the old pod is
done, then follows the new pod from where they end (the cursor drops the overlap).

Only lines: no parsing, no store. Bounded: past MAX_BYTES (or a line over kubectl's reader
limit) reading stops, and what follows is read from the pod afterwards as usual."""

from __future__ import annotations

import asyncio
import contextlib

from steptail.collector.cluster import kubectl

MAX_BYTES = 64 << 20  # lines held at most (a grace period of a chatty pod is a few MB)


class Prefetch:
    def __init__(self, key: str, argv: list[str], env: dict[str, str], max_rss: int | None) -> None:
        self.key = key  # the stream read (follower.stream_key)
        self.lines: list[bytes] = []
        self.bytes = 0
        self.stopped_early = False  # bound reached or a line too long: the rest is read later
        self._task = asyncio.create_task(self._read(argv, env, max_rss), name=f"prefetch {key}")

    async def _read(self, argv: list[str], env: dict[str, str], max_rss: int | None) -> None:
        proc = await kubectl.spawn(argv, env)
        size = kubectl.SizeWatch(proc, max_rss)
        try:
            while True:
                try:
                    line = await proc.stdout.readline()
                except ValueError:  # a line over the reader's limit: the follower's own read handles it
                    self.stopped_early = True
                    return
                if not line or size.rss is not None:
                    return  # the container ended, kubectl failed or was killed: what came is held
                self.lines.append(line)
                self.bytes += len(line)
                if self.bytes >= MAX_BYTES:
                    self.stopped_early = True
                    return
        finally:
            size.close()
            await kubectl.stop(proc)

    async def take(self) -> list[bytes]:
        """Stop reading; the lines read so far, in order."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        return self.lines

    def cancel(self) -> None:
        self._task.cancel()
