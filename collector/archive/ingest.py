"""Process 0's archived logs into the store, as the JobSet's own logs: the run's source is
`kubernetes:<namespace>/<jobset>` and each file is read as the stream `follow` gives that
container, so an archive of a followed JobSet adds only what follow did not read. The
manifest is recorded for the run (`run_files`), for `export`."""

from __future__ import annotations

from pathlib import Path

from steptail.collector.archive.job import ArchiveResult
from steptail.collector.offline.ingest import IngestResult, Origin, ingest_paths
from steptail.parsers.timestamps import parse_rfc3339
from steptail.runs.detect import Settings
from steptail.storage.db import Store
from steptail.storage.run_files import ARCHIVE_MANIFEST, RunFile, record_file
from steptail.storage.sources import kubernetes_source


def process0_files(result: ArchiveResult) -> tuple[list[str], Origin]:
    """Paths of process 0's files (every attempt, previous containers included; the container
    follow reads) and the Origin that names their streams. ingest puts them in time order."""
    m, folder = result.manifest, result.folder
    main = {name: p.containers[0].name for name, p in m.pods.items() if p.process0 and p.containers}
    paths, streams, finished = [], {}, set()
    for e in sorted(m.files.values(), key=lambda e: e.path):
        if main.get(e.pod) != e.container or not e.lines:
            continue
        path = str(folder / e.path)
        key = f"{e.pod_uid}/{e.container}/{e.restart_count}"
        paths.append(path)
        streams[path] = key
        if e.final:
            finished.add(key)
    origin = Origin(kubernetes_source(m.namespace, m.jobset), m.jobset, m.namespace, streams, frozenset(finished))
    return paths, origin


def ingest_archive(db: str | None, run: str, result: ArchiveResult, *, parquet: str | None = None,
                   append: bool = False, settings: Settings | None = None,
                   reference_ce: dict[int, float] | None = None) -> IngestResult | None:
    """None when process 0 left no log. Raises what ingest_paths raises (NoRecords, SourceConflict, …).
    `parquet`: a local dataset folder, or a table location (s3://, gs://, file://) whose lake
    is brought up to date from SQL after the commit (the result's lake_rows / lake_error)."""
    paths, origin = process0_files(result)
    if not paths:
        return None
    return ingest_paths(db, run, paths, parquet=parquet, append=append, settings=settings,
                        reference_ce=reference_ce, origin=origin)


def record_manifest(store: Store, run: str, result: ArchiveResult) -> None:
    files = result.manifest.files.values()
    times = [parse_rfc3339(t) for e in files for t in (e.first_timestamp, e.last_timestamp) if t]
    with store.engine.begin() as conn:
        record_file(conn, RunFile(run, ARCHIVE_MANIFEST, str(Path(result.manifest_path).resolve()),
                                  result.manifest_sha256, result.manifest_bytes, sum(e.lines for e in files),
                                  min(times, default=None), max(times, default=None)))
