"""`steptail reparse RUN --raw DIR`: a followed run's rows rebuilt from its raw process-0 log
(`follow --raw`) with the current parsers, through the offline path of `ingest` (run model,
dedupe cursors, detectors), each raw stream fed as the stream `follow` read it.

Into a new run (default RUN-reparse), which also gets the run's stream gaps, reconnects,
live-only findings and raw segments; or, with `replace`, into RUN itself: its old rows are
deleted and the new ones written in one transaction (all of it, or nothing changes). The
result says what changed, by record kind (storage.reparse.diff)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from steptail.collector.offline.files import open_source
from steptail.collector.offline.ingest import Ingest, IngestError, IngestResult, Origin
from steptail.runs.detect import Settings
from steptail.runs.names import check_run_name
from steptail.storage.db import Store
from steptail.storage.durable import file_sha256
from steptail.storage.raw import RawStream, read_members, scan
from steptail.storage.reads import UnknownRun, run_exists
from steptail.storage.reparse import (
    clear_rows,
    copy_read_facts,
    diff,
    pod_facts,
    restore_pod_facts,
    run_origin,
    snapshot,
)
from steptail.storage.run_files import RAW_SEGMENT, run_files
from steptail.storage.sources import FILES


class ReparseError(IngestError):
    """Bad input (no raw log, a segment that does not match its record, a taken name): one line."""


@dataclass
class ReparseResult:
    run: str
    into: str
    replace: bool
    segments: int = 0
    streams: int = 0
    truncated: list[str] = field(default_factory=list)  # segments whose cut-off tail was left out
    changes: dict[str, dict] = field(default_factory=dict)
    ingest: IngestResult | None = None

    def document(self) -> dict:
        i = self.ingest
        return {"run": self.run, "into": self.into, "replace": self.replace, "streams": self.streams,
                "segments": self.segments, "truncated": self.truncated,
                "lines": i.lines if i else 0, "duplicates": i.duplicates if i else 0,
                "bad_lines": i.bad_lines if i else 0, "changes": self.changes,
                "changed": any(c["added"] or c["removed"] or c["changed"] for c in self.changes.values())}


def find_streams(store: Store, run: str, root: str | Path) -> list[RawStream]:
    """The run's raw streams: DIR/<run>/ scanned, with the segments run_files records (which
    must be there, whole: a closed one is checked against its sha256)."""
    with store.engine.connect() as conn:
        recorded = run_files(conn, run, RAW_SEGMENT)
    roots = [Path(root)] + sorted({Path(f.path).parent.parent.parent for f in recorded} - {Path(root)})
    streams: dict[str, RawStream] = {}
    seen: set[Path] = set()
    for r in roots:
        for s in scan(r, run):
            into = streams.setdefault(s.stream, RawStream(s.stream, s.pod, []))
            for seg in s.segments:
                if seg.resolve() not in seen:
                    seen.add(seg.resolve())
                    into.segments.append(seg)
    for f in recorded:
        path = Path(f.path)
        if not path.is_file():
            raise ReparseError(f"raw segment {path} recorded for run {run} is missing")
        if f.sha256 is not None and file_sha256(path) != f.sha256:
            raise ReparseError(f"raw segment {path} does not match its recorded sha256")
    if not streams:
        raise ReparseError(f"no raw segments of run {run} under {Path(root) / run}")
    return list(streams.values())


def reparse(store: Store, run: str, raw_root: str | Path, *, into: str | None = None, replace: bool = False,
            settings: Settings | None = None, reference_ce: dict[int, float] | None = None,
            examples: int = 3, progress: Callable[[int, int], None] | None = None) -> ReparseResult:
    """`progress(bytes_read, total_bytes)` of the raw segments, as the rebuild reads them."""
    check_run_name(run)
    if replace and into is not None and into != run:
        raise ReparseError("--into and --replace exclude each other")
    target = run if replace else (into or f"{run}-reparse")
    check_run_name(target)
    if target == run and not replace:
        raise ReparseError(f"--into {run} is the run itself: use --replace")
    if not run_exists(store, run):
        raise UnknownRun(f"no run {run!r} in {store.describe()}")
    if not replace and run_exists(store, target):
        raise ReparseError(f'run "{target}" exists: choose another --into, or --replace {run}')
    with store.engine.connect() as conn:
        jobset, namespace, sources, done = run_origin(conn, run)
    streams = find_streams(store, run, raw_root)
    result = ReparseResult(run, target, replace, streams=len(streams),
                           segments=sum(len(s.segments) for s in streams))
    with tempfile.TemporaryDirectory(prefix="steptail-reparse-") as tmp:
        opened, keys = [], {}
        try:
            for n, s in enumerate(streams):
                path = Path(tmp) / f"{n:04d}.log"
                with path.open("wb") as out:
                    for seg in s.segments:
                        members, cut = read_members(seg.read_bytes())
                        if cut:
                            result.truncated.append(str(seg))
                        out.writelines(members)
                src = open_source(str(path))
                src.pod, src.label = s.pod, str(s.segments[0].parent)
                opened.append(src)
                keys[src.name] = s.stream
            origin = Origin(source=sources[0] if sources else FILES, jobset=jobset, namespace=namespace,
                            streams=keys, finished=frozenset(done & set(keys.values())))
            total = sum(path.stat().st_size for path in Path(tmp).iterdir())
            tick = (lambda pos: progress(pos, total)) if progress else None
            rebuild = _Rebuild(store, target, settings=settings, reference_ce=reference_ce, origin=origin,
                               source=run, replace=replace, progress=tick)
            result.ingest = rebuild(opened)
        finally:
            for src in opened:
                src.close()
    result.changes = diff(rebuild.before, rebuild.after, examples)
    return result


@dataclass
class _Rebuild(Ingest):
    """The offline ingest into the reparsed run, which first clears the run's rows (replace)
    or copies what only follow knew (a new run), and reads both sides for the diff, all in
    its one transaction."""

    evaluation = "reparse"
    source: str = ""  # the run reparsed
    replace: bool = False
    before: dict = field(default_factory=dict)  # the source run's rows, by kind, before
    after: dict = field(default_factory=dict)  # the rebuilt run's, after
    pods: dict = field(default_factory=dict)  # what each pod ran on (follow read it off the cluster)

    def prepare(self, conn) -> None:
        self.before = snapshot(conn, self.source)
        self.pods = pod_facts(conn, self.source)
        if self.replace:
            clear_rows(conn, self.source)
        else:
            copy_read_facts(conn, self.source, self.run)

    def before_commit(self, conn) -> None:
        restore_pod_facts(conn, self.run, self.pods)
        self.after = snapshot(conn, self.run)
