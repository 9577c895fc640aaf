"""`steptail archive`: every pod log of a JobSet saved (gzip + manifest.json), then process 0's
logs ingested into the store."""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import click

from steptail.commands._common import count, db_option, fail, warn
from steptail.commands._detect_options import Detection, detector_options
from steptail.commands._preflight import checked_store, cluster_target
from steptail.commands.lake import PARQUET_HELP, close, open_lake, table_location
from steptail.output import Output, output_option


@click.command()
@click.option("--jobset", required=True, metavar="NAME", help="JobSet whose pods to archive.")
@click.option("-n", "--namespace", default="default", show_default=True)
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Archive folder: files go under OUT/<jobset>/ (created).")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), help="Passed to kubectl and the API client.")
@click.option("--context", help="kubeconfig context.")
@click.option("--account", help="Service account for kubectl's auth plugin (else $CLOUDSDK_CORE_ACCOUNT).")
@click.option("--parallel", type=int, default=8, show_default=True, help="Logs read at once (1-64).")
@click.option("--run", "run_name", help="Run to ingest process 0 into (default: the JobSet name).")
@db_option
@click.option("--parquet", metavar="DIR|URL", help=PARQUET_HELP)
@click.option("--no-ingest", is_flag=True, help="Archive only: leave the store alone.")
@click.option("--append", is_flag=True,
              help="Ingest into a run that holds data of another source (files, another JobSet) as the "
                   "same run. Without it such a run is refused (exit 2) before anything is read.")
@detector_options
@output_option()
def command(output: Output, **options) -> None:
    """Save every pod log of a JobSet before it is deleted: all replicated jobs, job indices
    and restart attempts still present, the current container's log and, after a restart,
    the previous one's, with kubelet timestamps (as `kubectl logs --timestamps`, read-only).

    \b
    OUT/<jobset>/<pod>/<container>.log.gz            current container
    OUT/<jobset>/<pod>/<container>.previous.log.gz   the one before a restart
    OUT/<jobset>/manifest.json                       pods, nodes, phases, restart counts,
                                                     bytes, lines, first/last timestamp,
                                                     sha256 of every file, errors

    Each file is written under a temporary name and renamed when complete. Run it again to
    resume: a file whose container had terminated and whose sha256 verifies is not read
    again; a running container's log is read again and rewritten only if it changed.

    Then process 0's logs (every attempt, in time order) are ingested into --run, as the
    JobSet's own logs: what `follow` recorded from this JobSet is not added twice. The
    manifest is recorded for the run (`export` adds it to the ledger).

    --parquet URL (s3://, gs://, file://): after the ingest, the lake's Iceberg tables (their
    catalog in --db) are brought up to date from SQL; a failure there only warns (SQL holds
    the rows: `steptail lake catch-up URL RUN` fills them in).

    Exit 0: everything read; 1: some log could not be read (each pod is listed; a pod
    deleted meanwhile, say); 2: bad options, kubeconfig, API unreachable or refused.

    
    Example:
      steptail archive --jobset sft-7 -n post-training --out archives --parquet gs://my-bucket/steptail"""
    archive = Archive(output=output, **options)  # complete
    archive.validate()
    archive.report(*archive.run())


@dataclass
class Archive:
    """`archive` in three steps, as `follow`: the options completed into this object,
    validated (the first bad one is one line and exit 2, nothing read), run."""

    output: Output
    jobset: str
    namespace: str
    out: Path
    kubeconfig: str | None
    context: str | None
    account: str | None
    parallel: int
    run_name: str | None
    db: str | None
    parquet: str | None
    no_ingest: bool
    append: bool
    detection: Detection
    lake: bool = False  # validated: --parquet names a table location
    target: object = None  # validated: the KubeTarget
    settings: object = None  # validated: runs.detect.Settings
    reference: object = None  # validated: the run's reference CE

    @property
    def run_to(self) -> str:
        """The run process 0 is ingested into."""
        return self.run_name or self.jobset

    def validate(self) -> None:
        if not 1 <= self.parallel <= 64:
            fail(f"--parallel must be 1 to 64, not {self.parallel}")
        if self.no_ingest and (self.parquet or self.run_name or self.append):
            fail("--no-ingest excludes --run, --parquet and --append")
        self.lake = table_location(self.parquet)
        self.target = cluster_target(self.namespace, self.kubeconfig, self.context, self.account,
                                     (self.jobset, self.run_to))
        self.settings, self.reference = self.detection.resolve(self.run_to)

    def run(self):
        """(the archive's result, what was ingested: None with --no-ingest or no process-0 log)."""
        from steptail.collector.archive.job import ArchiveError, archive
        from steptail.collector.archive.manifest import ManifestError
        from steptail.collector.archive.pods import ListError

        run, output = self.run_to, self.output
        # a bad store or a run of another source: refused before anything is read
        store = None if self.no_ingest else checked_store(self.db, self.namespace, {run: self.jobset}, self.append)
        if store is not None and self.lake:
            close(open_lake(store, self.parquet))  # its catalog opens, its tables are there: else exit 2 now
        try:
            with _progress(self.jobset, show=_terminal() and not output.machine) as progress:
                result = asyncio.run(archive(self.target, self.jobset, self.out, parallel=self.parallel,
                                             progress=progress))
        except (ArchiveError, ListError, ManifestError) as exc:
            _dispose(store)
            fail(str(exc))
        except OSError as exc:
            _dispose(store)
            at = f": {exc.filename}" if exc.filename else ""  # which file (collector.archive.files.with_path)
            fail(f"cannot write the archive under {self.out}: {exc.strerror or exc}{at}; no partial file left")
        for e in result.errors:
            warn(f"{e['pod']}: {e['container']}{' --previous' if e['previous'] else ''}: {e['reason']}")
        ingested = None
        if store is not None:
            try:
                ingested = _ingest(store, self.db, run, result, self.parquet, self.append, self.settings,
                                   self.reference)
            finally:
                store.dispose()
        return result, ingested

    def report(self, result, ingested) -> None:
        output, run = self.output, self.run_to
        summary = result.summary() | {"run": None if self.no_ingest else run,
                                      "ingest": None if ingested is None else ingested.summary()
                                      | {"duplicates": ingested.duplicates, "no_records": ingested.no_records}
                                      | ({"lake": {"location": self.parquet, "rows_added": ingested.lake_rows,
                                                   "error": ingested.lake_error}} if self.lake else {})}
        if ingested is not None and ingested.lake_error:
            warn(f"the lake at {self.parquet} is behind ({ingested.lake_error}); run {run}'s rows are in SQL: "
                 f"`steptail lake catch-up {self.parquet} {run}` fills it")
        if output.machine:
            output.data(summary)
        else:
            _print(output, result, run, ingested, self.no_ingest)
        if result.errors:
            pods = result.failed_pods()
            fail(f"could not read {count(len(result.errors), 'log')} of {count(len(pods), 'pod')}: {', '.join(pods)} "
                 f"(the manifest lists them; run again to retry)", code=1)


def _ingest(store, db, run, result, parquet, append, settings, reference):
    """Process 0 into the store and the manifest recorded; one line and exit 2 on failure."""
    from steptail.collector.archive.ingest import ingest_archive, record_manifest
    from steptail.collector.offline.files import SourceError
    from steptail.collector.offline.ingest import IngestError, NoRecords
    from steptail.storage.db import StoreError
    from steptail.storage.sources import SourceConflict, sources_of

    ingested = None
    try:
        ingested = ingest_archive(db, run, result, parquet=parquet, append=append, settings=settings,
                                  reference_ce=reference)
    except NoRecords:
        warn(f"process 0's logs hold no record line: nothing ingested into run {run}")
    except (IngestError, SourceError, StoreError, SourceConflict) as exc:
        fail(f"archive complete ({result.manifest_path}); ingest failed: {exc}")
    with store.engine.connect() as conn:
        if not sources_of(conn, run):
            return ingested  # no run to record the manifest for
    record_manifest(store, run, result)
    return ingested


def _print(output: Output, result, run: str, ingested, no_ingest: bool) -> None:
    mb = result.bytes / 1e6
    if result.read == 0 and not result.errors:
        output.line(f"[bold]{result.manifest.jobset}[/]: {count(result.skipped, 'file')} already archived and verified, "
                    f"0 read ({result.folder})")
    else:
        output.line(f"[bold]{result.manifest.jobset}[/]: {count(result.read, 'log')} read ({mb:.1f} MB) from "
                    f"{count(result.listed, 'pod')}: {result.written} written ({result.bytes_compressed / 1e6:.1f} MB gzip), "
                    f"{result.unchanged} unchanged; {result.skipped} already archived and verified; "
                    f"{len(result.errors)} unreadable")
    output.line(f"  manifest: {result.manifest_path} (sha256 {result.manifest_sha256[:12]}…)", markup=False)
    if no_ingest:
        return
    if ingested is None:
        output.line(f"  ingest: process 0 left no log to ingest into run {run}", markup=False)
        return
    output.line(f"  ingest into run {run}: {ingested.loss_parts} LOSS-PARTS, {ingested.required_rbf} REQUIRED_RBF "
                f"from {count(ingested.lines, 'line')}; {count(ingested.incarnations, 'incarnation')}; "
                f"{count(ingested.duplicates, 'line')} already recorded", markup=False)
    if ingested.lake_rows is not None:
        output.line(f"  lake: {count(ingested.lake_rows, 'row')} added", markup=False)


def _dispose(store) -> None:
    if store is not None:
        store.dispose()


def _terminal() -> bool:
    from rich.console import Console

    return Console(stderr=True).is_terminal


@contextmanager
def _progress(jobset: str, show: bool):
    """A transient bar on stderr (a terminal only): logs done of those to read, MB read."""
    from steptail.collector.archive.job import Progress

    if not show:
        yield Progress()
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar

    bar = Bar(TextColumn("archive {task.description}"), BarColumn(), MofNCompleteColumn(),
              TextColumn("{task.fields[mb]:.1f} MB"), TimeElapsedColumn(),
              console=Console(stderr=True), transient=True)
    task = bar.add_task(jobset, total=None, mb=0.0)
    read = [0]

    def on_bytes(n: int) -> None:
        read[0] += n
        bar.update(task, mb=read[0] / 1e6)

    bar.start()
    try:
        yield Progress(start=lambda total: bar.update(task, total=total), bytes=on_bytes,
                       done=lambda: bar.advance(task))
    finally:
        bar.stop()
