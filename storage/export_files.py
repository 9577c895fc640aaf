"""The files a run keeps beside the store, added to its ledger bundle (storage.export): the
raw process-0 log (`follow --raw` segments) and the pod-log archive manifest (`steptail
archive`) with its process-0 log files. Each is copied, checked against the sha256 recorded
for it (a mismatch refuses the export: the ledger never gets a file other than the one
recorded), and listed in the bundle's manifest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import sqlalchemy as sa

from steptail.parsers import format_ns
from steptail.storage.paths import UnsafePath, inside, relative_inside
from steptail.storage.raw import META
from steptail.storage.run_files import ARCHIVE_MANIFEST, RAW_SEGMENT, run_files

RAW_DIR, ARCHIVE_DIR = "raw", "archive"


class BundleFileError(Exception):
    """A recorded file that is missing or does not match its sha256; one line."""


def _copy(src: Path, dst: Path) -> str:
    """Copy, hashing what was copied (a segment still being written is copied as it is now)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with src.open("rb") as fin, dst.open("wb") as fout:
        while block := fin.read(1 << 20):
            h.update(block)
            fout.write(block)
    return h.hexdigest()


def _ts(ns: int | None) -> str | None:
    return format_ns(ns) if ns is not None else None


def add_raw(conn: sa.Connection, run: str, folder: Path) -> dict | None:
    """The run's raw segments under folder/raw/<stream>/; their manifest section (None: none)."""
    segments = []
    for f in run_files(conn, run, RAW_SEGMENT):
        src = Path(f.path)
        if not src.is_file():
            raise BundleFileError(f"raw segment {src} recorded for run {run} is missing")
        rel = f"{RAW_DIR}/{src.parent.name}/{src.name}"
        sha = _copy(src, _within(folder, RAW_DIR, src.parent.name, src.name))
        if f.sha256 is not None and sha != f.sha256:
            raise BundleFileError(f"raw segment {src} does not match its recorded sha256")
        meta = src.parent / META
        stream = pod = None
        if meta.is_file():
            info = json.loads(meta.read_text())
            stream, pod = info.get("stream"), info.get("pod")
        segments.append({"file": rel, "stream": stream, "pod": pod, "sha256": sha,
                         "closed": f.sha256 is not None, "bytes": f.bytes, "lines": f.lines,
                         "first_ts": _ts(f.first_ns), "last_ts": _ts(f.last_ns)})
    return {"segments": segments} if segments else None


def add_archives(conn: sa.Connection, run: str, folder: Path) -> list[dict]:
    """Each archive manifest recorded for the run, and its process-0 files (the container
    `follow` reads, every attempt), under folder/archive/<jobset>/."""
    out = []
    for f in run_files(conn, run, ARCHIVE_MANIFEST):
        src = Path(f.path)
        if not src.is_file():
            raise BundleFileError(f"archive manifest {src} recorded for run {run} is missing")
        data = src.read_bytes()
        if f.sha256 is not None and hashlib.sha256(data).hexdigest() != f.sha256:
            raise BundleFileError(f"archive manifest {src} does not match its recorded sha256")
        doc = json.loads(data)
        base = f"{ARCHIVE_DIR}/{src.parent.name}"
        _within(folder, ARCHIVE_DIR, src.parent.name).mkdir(parents=True, exist_ok=True)
        _within(folder, ARCHIVE_DIR, src.parent.name, src.name).write_bytes(data)
        main = {p["name"]: (p.get("containers") or [{}])[0].get("name") for p in doc.get("pods") or []
                if p.get("job_index") == 0 and p.get("completion_index") == 0}
        files = []
        for e in doc.get("files") or []:
            if main.get(e.get("pod")) != e.get("container"):
                continue
            rel = Path(e["path"])
            try:  # names files in the bundle and beside the manifest: never outside either
                fsrc = relative_inside(src.parent, rel)
                dst = relative_inside(_within(folder, ARCHIVE_DIR, src.parent.name), rel)
            except UnsafePath:
                raise BundleFileError(f"archive manifest {src} names an unsafe path {e['path']!r}") from None
            if not fsrc.is_file():
                raise BundleFileError(f"archived log {fsrc} listed in {src} is missing")
            sha = _copy(fsrc, dst)
            if sha != e.get("sha256"):
                raise BundleFileError(f"archived log {fsrc} does not match the sha256 in {src}")
            files.append(f"{base}/{rel.as_posix()}")
        out.append({"manifest": f"{base}/{src.name}", "jobset": doc.get("jobset"),
                    "namespace": doc.get("namespace"), "sha256": f.sha256, "process0_files": files})
    return out


def _within(folder: Path, *parts: str) -> Path:
    """folder/parts…, or BundleFileError: a recorded file's name that would leave the bundle."""
    try:
        return inside(folder, *parts)
    except UnsafePath as exc:
        raise BundleFileError(f"refused: {exc}") from None


def ingested(conn: sa.Connection, run: str) -> list[dict]:
    """The sources ingested into the run, with their files' sha256."""
    return [{"source": s, "sha256": d, "lines": n} for s, d, n in conn.execute(sa.text(
        "SELECT source, sha256, lines FROM ingest_stats WHERE run = :run ORDER BY started_ns, id"), {"run": run})]


def bundle_files(folder: Path) -> list[Path]:
    """Every file of a bundle but its manifest, nested ones included."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() != "manifest.json")

