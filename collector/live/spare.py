"""A re-read opened beside the look at a quiet stream.

A stream quiet past its pace is asked about: the pod's newest line is read, and when the stream
has not delivered it, the stream hangs on a rotated file and is read again from the cursor.
Under a slow API the look and then the re-read were two round trips in series (chaos seed
1195: 2 s of quiet, a 2 s look, a 2 s re-read, and a rotation took lines servable for 5 s). So
the re-read is opened together with the look: when the stream hangs, it is the next read,
answered or on its way; when the stream is only quiet, it is stopped (one request per look).

Only a kubectl process: its lines wait in the pipe until the follower reads them."""

from __future__ import annotations

import asyncio

from steptail.collector.cluster import kubectl


class SpareRead:
    def __init__(self, argv: list[str], proc: asyncio.subprocess.Process) -> None:
        self.argv = argv
        self.proc = proc
        self.taken = False

    @classmethod
    async def open(cls, argv: list[str], env: dict[str, str]) -> SpareRead:
        return cls(argv, await kubectl.spawn(argv, env))

    def take(self, argv: list[str]) -> asyncio.subprocess.Process | None:
        """The read, when it is the one `argv` would open and was not refused already (a refusal
        from before the look answered would only delay the next read)."""
        if self.taken or argv != self.argv or self.proc.returncode not in (None, 0):
            return None
        self.taken = True
        return self.proc

    async def stop(self) -> None:
        if not self.taken:
            self.taken = True
            await kubectl.stop(self.proc)
