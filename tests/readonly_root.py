"""Run a command as in a pod with readOnlyRootFilesystem: every mount read-only except the
given directories (its emptyDirs). Run it under `unshare -m` as root, so the mounts change in a
private mount namespace only:

    unshare -m python tests/readonly_root.py --writable DIR... --probe PATH... -- COMMAND...

Exits 97 (the caller skips) when the namespace cannot be set up or a --probe path is still
writable; otherwise execs COMMAND."""

from __future__ import annotations

import argparse
import errno
import os
import subprocess
import sys
import tempfile

CANNOT = 97
KERNEL_FS = ("/proc", "/sys", "/dev")


def mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


def mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as fh:  # field 5: the mount point, octal-escaped
        return [line.split()[4].encode().decode("unicode_escape") for line in fh]


def read_only(path: str) -> bool:
    try:
        fd, name = tempfile.mkstemp(dir=path)
    except OSError as exc:
        return exc.errno == errno.EROFS
    os.close(fd)
    os.unlink(name)
    return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--writable", action="append", default=[])
    ap.add_argument("--probe", action="append", default=[])
    ap.add_argument("command", nargs=argparse.REMAINDER)
    opts = ap.parse_args()
    command = opts.command[1:] if opts.command[:1] == ["--"] else opts.command
    if not mount("--make-rprivate", "/"):
        sys.exit(CANNOT)
    keep = {os.path.realpath(d) for d in opts.writable}
    for d in keep:  # its own mount, so the read-only remounts below pass it by
        if not mount("--bind", d, d):
            sys.exit(CANNOT)
    for point in mount_points():
        if point in keep or any(point == k or point.startswith(k + "/") for k in KERNEL_FS):
            continue
        mount("-o", "remount,bind,ro", point)  # some special mounts refuse: the probes decide
    if not all(read_only(p) for p in opts.probe) or any(read_only(d) for d in keep):
        sys.exit(CANNOT)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
