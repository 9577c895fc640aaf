"""Benchmark of the image built with no registry (deploy/build-image.sh, as CI and
tests/test_image.py build it): the time of each step — the two mmdebstrap root filesystems, their
`podman import`, the kubectl copy and `buildah bud` — the image's size (podman image inspect, and
its `podman save` OCI archive), the scratch folder's size on disk (vfs), and the first and second
container runs (`steptail --version` as the Deployment runs it: user 65532, read-only root), each
a fresh copy of the image on vfs. The scratch is removed at the end.

    .venv/bin/python benchmarks/image.py [--json] [--kubectl context|apt]

Needs root, mmdebstrap, podman, buildah, runc, and the network (Debian's mirror, PyPI)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "deploy" / "build-image.sh"
TAG = "localhost/steptail:bench"
STEP = re.compile(r"^build-image: (\S+) took ([0-9.]+) s$", re.M)


def du_mb(path: Path) -> float:
    done = subprocess.run(["du", "-s", "--block-size=1M", "--one-file-system", str(path)],
                          capture_output=True, text=True, check=True)
    return float(done.stdout.split()[0])


def run_once(env: dict) -> float:
    """Seconds for one `podman run --rm` of `steptail --version`, create and removal included."""
    argv = ["podman", "run", "--rm", "--runtime", "runc", "--network=none",
            "--ulimit", "nofile=1024:20000", "--ulimit", "nproc=1024:1024",
            "--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp:rw,size=256m,mode=1777",
            "--user", "65532:65532", "--cap-drop", "all", "--security-opt", "no-new-privileges",
            TAG, "--version"]
    t = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t
    if done.returncode != 0 or "steptail" not in done.stdout:
        raise SystemExit(f"podman run failed ({done.returncode}): {done.stderr[-2000:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubectl", choices=["context", "apt"], default="context")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="steptail-image-bench-"))
    saved = Path(tempfile.mkdtemp(prefix="steptail-image-save-")) / "steptail.oci.tar"
    report: dict = {"kubectl": a.kubectl}
    try:
        t = time.monotonic()
        done = subprocess.run([str(BUILD), "--tag", TAG, "--scratch", str(scratch), "--keep",
                               "--save", str(saved), "--kubectl", a.kubectl],
                              capture_output=True, text=True, timeout=3600)
        report["script_wall_s"] = round(time.monotonic() - t, 1)
        if done.returncode != 0:
            raise SystemExit(f"build-image.sh failed ({done.returncode}):\n{done.stderr[-4000:]}")
        report.update({f"{name.replace('-', '_')}_s": float(s) for name, s in STEP.findall(done.stderr)})
        env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(scratch / "storage.conf"),
               "CONTAINERS_CONF": str(scratch / "containers.conf"), "TMPDIR": str(scratch / "tmp")}
        inspect = subprocess.run(["podman", "image", "inspect", TAG], env=env, capture_output=True,
                                 text=True, check=True)
        (image,) = json.loads(inspect.stdout)
        report["image_size_mb"] = round(image["Size"] / 1e6, 1)
        report["image_layers"] = len(image["RootFS"]["Layers"])
        report["saved_archive_mb"] = round(saved.stat().st_size / 1e6, 1)
        report["scratch_disk_mb"] = du_mb(scratch)
        report["first_run_s"] = round(run_once(env), 1)
        report["second_run_s"] = round(run_once(env), 1)
    finally:
        if (scratch / "storage.conf").exists():
            subprocess.run([str(BUILD), "--remove", str(scratch)], check=False, timeout=600)
        subprocess.run(["rm", "-rf", "--one-file-system", str(scratch), str(saved.parent)], check=False)
    if a.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:28} {v}")


if __name__ == "__main__":
    main()
