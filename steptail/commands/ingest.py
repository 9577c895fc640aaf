"""`steptail ingest`: saved process-0 logs into SQL (and Parquet)."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import click

from steptail.collector.offline.files import SourceError
from steptail.collector.offline.ingest import IngestError, NoRecords, ingest_paths
from steptail.commands._common import count, db_option, fail, warn
from steptail.commands._detect_options import Detection, detector_options
from steptail.commands._progress import progress_bar, wanted
from steptail.commands.lake import PARQUET_HELP, check_target, table_location
from steptail.output import Output, output_option
from steptail.runs.names import RunNameError, check_run_name
from steptail.storage.db import StoreError, remove_unused_store, sqlite_file
from steptail.storage.sources import SourceConflict


@click.command()
@click.argument("paths", nargs=-1, required=True, metavar="PATH…")
@click.option("--run", required=True, help="Run name (letters, digits, '.', '_', '-').")
@db_option
@click.option("--parquet", metavar="DIR|URL", help=PARQUET_HELP)
@click.option("--append", is_flag=True,
              help="The run was followed from a JobSet and these are saved logs of that same run: add "
                   "them to it (without this, ingesting into another source's run is refused).")
@detector_options
@output_option()
def command(paths: tuple[str, ...], run: str, db: str | None, parquet: str | None, append: bool,
            detection: Detection, output: Output) -> None:
    """Ingest saved pod logs of JAX process 0 (plain, --timestamps, .gz, '-' for stdin).

    Every LOSS-PARTS, REQUIRED_RBF, per-pod step, config and checkpoint line is recorded
    once per (run, incarnation, step); re-ingesting or overlapping files adds nothing twice.
    The run's findings are stored with its rows, as `steptail check RUN` (same detector
    options) would store them. The ingest lands whole or not at all. A run followed from a
    JobSet is not appended to unless --append says these logs belong to it.

    A PATH without one record line (e.g. a README) is refused with a warning: if no PATH has
    one, nothing is written and the exit status is 1; otherwise the others are ingested (exit 0).

    --parquet DIR: the run's rows as Parquet, with those stored before (an earlier ingest without
    --parquet) written from SQL after the commit, each (incarnation, step) once however often
    it runs.

    --parquet URL (s3://, gs://, file://): the lake's Iceberg tables, their catalog in --db,
    brought up to date from SQL after the commit (exactly once). Should that fail, a warning:
    SQL holds the rows, and the next ingest or `steptail lake catch-up URL RUN` fills them in.

    
    Examples:
      steptail ingest train.log.gz --run sft-7 --parquet parquet
      steptail ingest train.log.gz --run sft-7 --parquet gs://my-bucket/steptail
    """
    with _no_store_left(db):
        _ingest(paths, run, db, parquet, append, detection, output)


@contextmanager
def _no_store_left(db: str | None):
    """An ingest of sources without one record line (exit 1: nothing to write) leaves no SQLite
    store behind that it created (the schema alone, and its lock file). A failure (exit 2)
    keeps it, empty, as it always did: `runs` then says there is no run."""
    path = sqlite_file(db)
    new = path is not None and not path.exists()
    try:
        yield
    except SystemExit as exc:
        if new and exc.code == 1:
            remove_unused_store(path)
        raise


def _ingest(paths: tuple[str, ...], run: str, db: str | None, parquet: str | None, append: bool,
            detection: Detection, output: Output) -> None:
    try:
        check_run_name(run)
    except RunNameError as exc:
        fail(str(exc))
    lake = table_location(parquet)
    if lake:
        check_target(db, parquet)
    settings, reference = detection.resolve(run)
    try:
        with progress_bar(f"ingest {run}", wanted(output.machine)) as progress:
            result = ingest_paths(db, run, paths, parquet=parquet, append=append, settings=settings,
                                  reference_ce=reference, progress=progress)
    except NoRecords as exc:
        for name in exc.names:
            warn(_no_records(name))
        fail(f"nothing to ingest into run {run}: nothing written", code=1)
    except (IngestError, SourceError, StoreError, SourceConflict) as exc:
        fail(str(exc))
    for name in result.no_records:
        warn(_no_records(name))
    if result.lake_error:
        warn(f"the lake at {parquet} is behind ({result.lake_error}); run {run}'s rows are in SQL: "
             f"the next ingest or `steptail lake catch-up {parquet} {run}` fills it")
    if result.parquet_error:
        warn(f"Parquet at {parquet} lacks rows of run {run} stored before ({result.parquet_error}); they are "
             f"in SQL: the next ingest, follow or export --parquet {parquet} writes them")
    if result.findings_error:
        warn(f"findings of run {run} not updated (a detector failed: {result.findings_error}); "
             f"steptail check {run} computes them")
    if output.machine:
        output.data(result.summary() | {"duplicates": result.duplicates, "skipped": result.skipped,
                                        "findings": sum(result.findings.values()),
                                        "findings_by_kind": result.findings, "no_records": result.no_records,
                                        "sha256": result.sha256}
                    | ({"lake": {"location": parquet, "rows_added": result.lake_rows, "error": result.lake_error}}
                       if lake else {})
                    | ({"parquet": {"dir": parquet, "rows_back_filled": result.parquet_rows,
                                    "error": result.parquet_error}} if parquet and not lake else {}))
        return
    out = output
    out.line(
        f"[bold]{run}[/]: {result.loss_parts} LOSS-PARTS, {result.required_rbf} REQUIRED_RBF, "
        f"{count(result.pod_steps, 'per-pod step line')} from {count(result.lines, 'line')}; "
        f"{count(result.incarnations, 'incarnation')}; {count(result.bad_lines, 'bad line')}; "
        f"{count(result.duplicates, 'repeated line')} dropped"
        + (f"; {count(result.flagged, 'line')} flagged as step or clock jumps (steptail check {run})"
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
    if lake and result.lake_error is None:
        out.line(f"  lake: {parquet}: {count(result.lake_rows, 'row')} added", markup=False)
    elif parquet and not lake:
        filled = f" ({count(result.parquet_rows, 'row')} stored before written from SQL)" if result.parquet_rows else ""
        out.line(f"  parquet: {parquet}{filled}", markup=False)
    sys.stdout.flush()


def _no_records(name: str) -> str:
    return (f"{name}: no record line (LOSS-PARTS, REQUIRED_RBF, per-pod step, config, checkpoint or "
            "trainer start-up); not ingested")


