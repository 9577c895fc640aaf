"""`manifest.json` of a JobSet's archive folder: its pods, every file with its counts and
sha256, and what could not be read. A second archive starts from it (what is final and
verifies is not read again) and keeps what it lists, pods deleted since included."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from steptail import __version__
from steptail.collector.archive.files import LogStats, write_json
from steptail.collector.archive.pods import LogTask, PodRecord
from steptail.parsers.timestamps import format_ns, parse_rfc3339
from steptail.storage.durable import sha256_or_none
from steptail.storage.paths import relative_inside

NAME = "manifest.json"
FORMAT = 1


class ManifestError(Exception):
    """An existing manifest that cannot be used (unreadable, another JobSet's); one line."""


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the manifest
    pod: str
    pod_uid: str
    container: str
    previous: bool
    restart_count: int  # of the container instance
    final: bool  # that instance had terminated: the file is its whole log
    bytes: int  # uncompressed
    bytes_compressed: int
    lines: int
    first_timestamp: str | None
    last_timestamp: str | None
    sha256: str  # of the .gz file
    content_sha256: str  # of the uncompressed log

    @classmethod
    def of(cls, task: LogTask, stats: LogStats) -> FileEntry:
        return cls(task.path, task.pod.name, task.pod.uid, task.container, task.previous, task.restart_count,
                   task.final, **asdict(stats))

    def same_instance(self, task: LogTask) -> bool:
        return (self.pod_uid, self.container, self.restart_count) == (task.pod.uid, task.container, task.restart_count)


@dataclass
class Manifest:
    jobset: str
    namespace: str
    created: str = field(default_factory=lambda: format_ns(time.time_ns()))
    pods: dict[str, PodRecord] = field(default_factory=dict)
    listed: set[str] = field(default_factory=set)  # pods the latest listing returned
    files: dict[str, FileEntry] = field(default_factory=dict)
    errors: list[dict] = field(default_factory=list)  # of the latest archive, and logs lost for good

    def verified(self, folder: Path, task: LogTask) -> FileEntry | None:
        """The entry of a final file that exists and whose sha256 verifies: nothing to read."""
        e = self.files.get(task.path)
        if e is None or not e.final or not e.same_instance(task):
            return None
        return e if sha256_or_none(_at(folder, e.path)) == e.sha256 else None

    def unchanged(self, folder: Path, task: LogTask, stats: LogStats) -> bool:
        """A re-read that holds what the file holds already (the file verifies)."""
        e = self.files.get(task.path)
        return (e is not None and e.same_instance(task) and e.content_sha256 == stats.content_sha256
                and sha256_or_none(_at(folder, e.path)) == e.sha256)

    def to_dict(self) -> dict:
        pods = sorted(self.pods.values(), key=lambda p: (p.restart_attempt or 0, p.name))
        times = [parse_rfc3339(t) for e in self.files.values() for t in (e.first_timestamp, e.last_timestamp) if t]
        return {
            "format": FORMAT,
            "jobset": self.jobset,
            "namespace": self.namespace,
            "steptail_version": __version__,
            "created": self.created,
            "updated": format_ns(time.time_ns()),
            "first_timestamp": format_ns(min(times)) if times else None,
            "last_timestamp": format_ns(max(times)) if times else None,
            "pods": [{**p.manifest(), "listed": p.name in self.listed} for p in pods],
            "files": [asdict(e) for _, e in sorted(self.files.items())],
            "errors": self.errors,
        }

    def save(self, folder: Path) -> tuple[str, int]:
        """(sha256, bytes) of the manifest written."""
        return write_json(folder / NAME, self.to_dict())


def _at(folder: Path, path: str) -> Path:
    """A manifest entry's file (the manifest is input: an entry naming `../x` is refused)."""
    return relative_inside(folder, path)


def load(folder: Path, jobset: str, namespace: str) -> Manifest:
    """The folder's manifest, or a new one. ManifestError for one that is unreadable or of
    another JobSet (never overwritten by accident)."""
    path = folder / NAME
    if not path.exists():
        return Manifest(jobset, namespace)
    try:
        doc = json.loads(path.read_text())
        if (doc.get("jobset"), doc.get("namespace")) != (jobset, namespace):
            raise ManifestError(f"{path} is the archive of JobSet {doc.get('namespace')}/{doc.get('jobset')}, "
                                f"not {namespace}/{jobset}: choose another --out")
        names = {f.name for f in fields(FileEntry)}
        m = Manifest(jobset, namespace, created=doc.get("created") or format_ns(time.time_ns()))
        for p in doc.get("pods") or []:
            p = dict(p)
            if p.pop("listed", False):
                m.listed.add(p["name"])
            m.pods[p["name"]] = PodRecord.from_manifest(p)
        for f in doc.get("files") or []:
            _at(folder, f["path"])  # UnsafePath (a ValueError): the manifest is refused whole
            m.files[f["path"]] = FileEntry(**{k: v for k, v in f.items() if k in names})
        m.errors = list(doc.get("errors") or [])
        return m
    except ManifestError:
        raise
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ManifestError(f"cannot read {path}: {exc}; move it away to archive afresh") from None
