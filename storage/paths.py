"""Paths built from names that are input (run names, JobSet and pod names, stream keys,
entries of a manifest): one place that makes sure no value can leave its directory.

Names are checked where they arrive (runs.names); this is the last line, whatever a value
holds: every part must be one path component, and the joined path, symlinks resolved, must
still be inside the root. Anything else is refused, never written."""

from __future__ import annotations

import os
from pathlib import Path

NAME_MAX = 255  # bytes of one component on Linux filesystems (ENAMETOOLONG beyond)


class UnsafePath(ValueError):
    """A path part that is not one safe component, or a path that would leave its root; one line."""


def component(part: str) -> str:
    """`part` if it is exactly one path component that fits a filesystem; else UnsafePath."""
    if (not isinstance(part, str) or part in ("", ".", "..") or "/" in part or "\\" in part or "\0" in part
            or len(os.fsencode(part)) > NAME_MAX):
        raise UnsafePath(f"unsafe path component {part[:80]!r}{'…' if len(part) > 80 else ''}"
                         if isinstance(part, str) else f"unsafe path component {part!r}")
    return part


def inside(root: str | os.PathLike, *parts: str) -> Path:
    """root/part/…, absolute (not resolved: paths recorded stay as given), each part one
    component and the result — symlinks followed — still under root; else UnsafePath."""
    base = Path(root).absolute()
    path = base.joinpath(*(component(p) for p in parts))
    if not path.resolve().is_relative_to(base.resolve()):
        raise UnsafePath(f"{path} leaves {base}")
    return path


def relative_inside(root: str | os.PathLike, rel: str | os.PathLike) -> Path:
    """root/rel for a relative path of several components (a manifest's entry), each one
    checked as `inside` checks them."""
    rel = Path(rel)
    if rel.is_absolute():
        raise UnsafePath(f"absolute path {str(rel)[:80]!r} where a relative one is expected")
    return inside(root, *rel.parts)
