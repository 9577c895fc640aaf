"""`steptail ingest`: saved process-0 logs into SQL (and Parquet)."""

from __future__ import annotations

import sys
import zlib

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn
from sqlalchemy.exc import DBAPIError

from collector.files import SourceError, open_source
from steptail.commands._common import db_option, fail, json_option, print_json, store_or_exit
from steptail.ingest import IngestError, check_run_name, ingest, start_workers
from storage.db import failure_reason
from storage.parquet import ParquetError
from storage.sources import SourceConflict


@click.command()
@click.argument("paths", nargs=-1, required=True, metavar="PATH…")
@click.option("--run", required=True, help="Run name (letters, digits, '.', '_', '-').")
@db_option
@click.option("--parquet", metavar="DIR", help="Also write Parquet: DIR/<table>/run=<run>/part-*.parquet.")
@click.option("--append", is_flag=True,
              help="The run was followed from a JobSet and these are saved logs of that same run: add "
                   "them to it (without this, ingesting into another source's run is refused).")
@json_option
def command(paths: tuple[str, ...], run: str, db: str | None, parquet: str | None, append: bool,
            as_json: bool) -> None:
    """Ingest saved pod logs of JAX process 0 (plain, --timestamps, .gz, '-' for stdin).

    Every LOSS-PARTS, REQUIRED_RBF, per-pod step, config and checkpoint line is recorded
    once per (run, incarnation, step); re-ingesting or overlapping files adds nothing twice.
    The ingest lands whole or not at all. A run followed from a JobSet is not appended to
    unless --append says these logs belong to it.
    """
    try:
        check_run_name(run)
    except IngestError as exc:
        fail(str(exc))
    if paths.count("-") > 1:
        fail("'-' (stdin) may be given once")
    sources = []
    try:
        for path in paths:
            sources.append(open_source(path))
    except SourceError as exc:
        for s in sources:
            s.close()
        fail(str(exc))
    pool = start_workers(sources)  # workers boot while the store is opened and migrated
    try:
        store = store_or_exit(db)
    except SystemExit:
        if pool is not None:
            pool.shutdown()
        raise
    total = sum(s.size or 0 for s in sources)
    err = Console(stderr=True)
    show = err.is_terminal and not as_json
    try:
        with Progress(
            "[progress.description]{task.description}", BarColumn(), DownloadColumn(),
            TimeRemainingColumn(), console=err, disable=not show, transient=True,
        ) as bar:
            task = bar.add_task(f"ingest {run}", total=total or None)
            def progress(pos: int) -> None:
                bar.update(task, completed=min(total, pos))

            result = ingest(store, run, sources, parquet=parquet,
                            progress=progress if show else None, pool=pool, append=append)
    except (IngestError, SourceConflict) as exc:
        fail(str(exc))
    except ParquetError as exc:  # before OSError: it is one
        fail(f"{exc}; nothing written (SQL rolled back)")
    except (OSError, EOFError, zlib.error) as exc:
        fail(f"read failed, nothing written: {exc}")
    except DBAPIError as exc:  # a full disk, a lost connection
        fail(f"cannot write to database {store.describe()}: {failure_reason(exc)}; nothing written")
    finally:
        if pool is not None:
            pool.shutdown()
        for s in sources:
            s.close()
        store.dispose()
    if as_json:
        print_json(result.summary() | {"duplicates": result.duplicates, "skipped": result.skipped})
        return
    out = Console()
    out.print(
        f"[bold]{run}[/]: {result.loss_parts} LOSS-PARTS, {result.required_rbf} REQUIRED_RBF, "
        f"{result.pod_steps} per-pod step lines from {result.lines} lines; "
        f"{result.incarnations} incarnation(s); {result.bad_lines} bad line(s); "
        f"{result.duplicates} repeated line(s) dropped"
        + (f"; {result.flagged} line(s) flagged as step or clock jumps (steptail check {run})"
           if result.flagged else "")
    )
    for sample in result.bad_samples:
        out.print(f"  bad: {sample}", markup=False, highlight=False)
    for name in result.skipped:
        out.print(f"  skipped {name}: already ingested (same content)")
    if parquet:
        out.print(f"  parquet: {parquet}")
    sys.stdout.flush()
