"""A transient progress bar on stderr for commands that can run longer than a couple of seconds
(ingest, reparse, export): shown on a terminal only and never with machine output, so pipes and
JSON stay clean. The command passes `progress(done, total)` down to the work."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

Progress = Callable[[int, int], None]


def wanted(machine: bool) -> bool:
    """Whether to draw a bar: stderr is a terminal and the output is for people."""
    from rich.console import Console

    return not machine and Console(stderr=True).is_terminal


@contextmanager
def progress_bar(label: str, show: bool, *, unit: str = "bytes") -> Iterator[Progress | None]:
    """`progress(done, total)` drawing a bar started at the first report (the total is known
    then); None when not shown. unit "bytes" shows MB read, anything else done/total `unit`."""
    if not show:
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TimeRemainingColumn,
    )

    count = DownloadColumn() if unit == "bytes" else MofNCompleteColumn()
    bar = Progress("[progress.description]{task.description}", BarColumn(), count, TimeRemainingColumn(),
                   console=Console(stderr=True), transient=True)
    task = None

    def progress(done: int, total: int) -> None:
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task(label, total=total or None)
        bar.update(task, completed=min(total, done))

    try:
        yield progress
    finally:
        bar.stop()
