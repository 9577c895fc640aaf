"""`steptail ingest`: saved process-0 logs into SQL (and Parquet)."""

from __future__ import annotations

import sys
import zlib

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn
from sqlalchemy.exc import DBAPIError

from collector.files import SourceError, open_source
from steptail.commands._common import db_option, fail, store_or_exit, warn
from steptail.commands._detect_options import detector_options, detector_settings
from steptail.findings import ReferenceError, reference_for
from steptail.ingest import IngestError, NoRecords, check_run_name, ingest, start_workers
from steptail.output import Output, output_option
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
@detector_options
@output_option()
def command(paths: tuple[str, ...], run: str, db: str | None, parquet: str | None, append: bool,
            reference_ce: str | None, gate_tolerance: float, resume_tolerance: float, stall_k: float,
            output: Output) -> None:
    """Ingest saved pod logs of JAX process 0 (plain, --timestamps, .gz, '-' for stdin).

    Every LOSS-PARTS, REQUIRED_RBF, per-pod step, config and checkpoint line is recorded
    once per (run, incarnation, step); re-ingesting or overlapping files adds nothing twice.
    The run's findings are stored with its rows, as `steptail check RUN` (same detector
    options) would store them. The ingest lands whole or not at all. A run followed from a
    JobSet is not appended to unless --append says these logs belong to it.

    A PATH without one record line (e.g. a README) is refused with a warning: if no PATH has
    one, nothing is written and the exit status is 1; otherwise the others are ingested (exit 0).
    """
    try:
        check_run_name(run)
    except IngestError as exc:
        fail(str(exc))
    settings, reference = detector_settings(reference_ce, gate_tolerance, resume_tolerance, stall_k)
    try:
        reference = reference_for(reference, run)
    except ReferenceError as exc:
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
    show = err.is_terminal and not output.machine
    try:
        with Progress(
            "[progress.description]{task.description}", BarColumn(), DownloadColumn(),
            TimeRemainingColumn(), console=err, disable=not show, transient=True,
        ) as bar:
            task = bar.add_task(f"ingest {run}", total=total or None)
            def progress(pos: int) -> None:
                bar.update(task, completed=min(total, pos))

            result = ingest(store, run, sources, parquet=parquet,
                            progress=progress if show else None, pool=pool, append=append,
                            settings=settings, reference_ce=reference)
    except NoRecords as exc:
        for name in exc.names:
            warn(_no_records(name))
        fail(f"nothing to ingest into run {run}: nothing written", code=1)
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
    for name in result.no_records:
        warn(_no_records(name))
    if result.findings_error:
        warn(f"findings of run {run} not updated (a detector failed: {result.findings_error}); "
             f"steptail check {run} computes them")
    if output.machine:
        output.data(result.summary() | {"duplicates": result.duplicates, "skipped": result.skipped,
                                        "findings": sum(result.findings.values()),
                                        "findings_by_kind": result.findings, "no_records": result.no_records})
        return
    out = output
    out.line(
        f"[bold]{run}[/]: {result.loss_parts} LOSS-PARTS, {result.required_rbf} REQUIRED_RBF, "
        f"{result.pod_steps} per-pod step lines from {result.lines} lines; "
        f"{result.incarnations} incarnation(s); {result.bad_lines} bad line(s); "
        f"{result.duplicates} repeated line(s) dropped"
        + (f"; {result.flagged} line(s) flagged as step or clock jumps (steptail check {run})"
           if result.flagged else "")
    )
    if not result.findings_error:
        kinds = ", ".join(f"{kind} {n}" for kind, n in result.findings.items())
        out.line(f"  findings: {sum(result.findings.values())}"
                 + (f" ({kinds}; steptail check {run})" if kinds else ""), markup=False)
    for sample in result.bad_samples:
        out.line(f"  bad: {sample}", markup=False)
    for name in result.skipped:
        out.line(f"  skipped {name}: already ingested (same content)", markup=False)
    if parquet:
        out.line(f"  parquet: {parquet}", markup=False)
    sys.stdout.flush()


def _no_records(name: str) -> str:
    return (f"{name}: no record line (LOSS-PARTS, REQUIRED_RBF, per-pod step, config, checkpoint or "
            "trainer start-up); not ingested")
