"""Files on disk: made durable (what every atomic write here — Parquet compaction, raw
segments, archived logs — does before and after its rename) and checked (sha256)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a file's bytes (OSError when it cannot be read)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def sha256_or_none(path: str | os.PathLike) -> str | None:
    """file_sha256, None when the file cannot be read (gone, not yet whole)."""
    try:
        return file_sha256(path)
    except OSError:
        return None


def hidden_name(final: str | os.PathLike, tag: str) -> Path:
    """Where a file is written before it is renamed to `final`, or set aside: beside it and
    hidden, `.<name>.<tag>` (every reader here skips names that start with "."), so a crash
    leaves only hidden files that recovery or clean-up find by their tag."""
    final = Path(final)
    return final.with_name(f".{final.name}.{tag}")


def fsync_path(path: str | Path, directory: bool = False) -> None:
    """fsync a file by name, or a folder (its entries: a rename into it survives a crash)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
