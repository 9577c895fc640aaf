"""Making a file or a folder's entries durable: what every atomic write here (Parquet
compaction, raw segments, archived logs) does before and after its rename."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: str | Path, directory: bool = False) -> None:
    """fsync a file by name, or a folder (its entries: a rename into it survives a crash)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
