"""Benchmark of `steptail archive` against the simulated cluster with the real kubectl.

A JobSet of 4 slices x 8 hosts = 32 pods whose containers each printed 20 MB (the `flood`
fault: XLA debug output) and completed; the simulator runs in its own process. Measured in
the same run:

1. 32 sequential `kubectl logs POD --timestamps` calls to /dev/null, and the same each piped
   into `gzip -1` to a file (what an operator does by hand);
2. `steptail archive --no-ingest` (default --parallel 8): wall time, peak RSS of the archive
   process and of its kubectl children (their sum at any instant, and the largest one);
3. the same archive run again (everything final and verified: nothing read);
4. `steptail archive` with process 0 ingested into SQLite.

    .venv/bin/python benchmarks/archive.py --json [--pods 32] [--mb 20]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "from steptail.cli import main; main()"]
ACCOUNT = "steptail-agent@steptail-sim.iam.gserviceaccount.com"
JOBSET = "bench"


@contextlib.contextmanager
def _sim_process(scenario: dict, folder: Path):
    """`steptail simcluster` in its own process; yields the kubeconfig path."""
    scen, kc = folder / "scenario.yaml", folder / "kubeconfig"
    scen.write_text(yaml.safe_dump(scenario))
    sim = subprocess.Popen([*CLI, "simcluster", "--scenario", str(scen), "--kubeconfig-out", str(kc)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while not kc.exists():
            if sim.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("simcluster did not start")
            time.sleep(0.05)
        yield str(kc)
    finally:
        sim.terminate()
        sim.wait(30)


def _kubectl(kc: str, *args: str) -> str:
    env = {**os.environ, "KUBECONFIG": kc, "CLOUDSDK_CORE_ACCOUNT": ACCOUNT}
    return subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, check=True).stdout


def _wait_done(kc: str, pods: int, timeout: float = 300) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(subprocess.CalledProcessError):
            out = _kubectl(kc, "get", "pods", "-n", "default", "-l", f"jobset.sigs.k8s.io/jobset-name={JOBSET}",
                           "-o", "jsonpath={range .items[*]}{.metadata.name} {.status.phase}{\"\\n\"}{end}")
            rows = [ln.split() for ln in out.splitlines() if ln.strip()]
            if len(rows) == pods and all(phase == "Succeeded" for _, phase in rows):
                return sorted(name for name, _ in rows)
        time.sleep(0.5)
    raise TimeoutError("the JobSet did not complete")


def _sequential(kc: str, names: list[str]) -> float:
    env = {**os.environ, "KUBECONFIG": kc, "CLOUDSDK_CORE_ACCOUNT": ACCOUNT}
    started = time.monotonic()
    with open(os.devnull, "wb") as null:
        for name in names:
            subprocess.run(["kubectl", "logs", name, "-c", "jax-tpu", "--timestamps", "-n", "default"],
                           env=env, stdout=null, check=True)
    return time.monotonic() - started


def _sequential_gzip(kc: str, names: list[str], out: Path) -> float:
    """The same 32 calls, each piped into `gzip -1` to a file (by hand, what the archive does)."""
    env = {**os.environ, "KUBECONFIG": kc, "CLOUDSDK_CORE_ACCOUNT": ACCOUNT}
    out.mkdir()
    started = time.monotonic()
    for name in names:
        with open(out / f"{name}.log.gz", "wb") as fh:
            kubectl = subprocess.Popen(["kubectl", "logs", name, "-c", "jax-tpu", "--timestamps", "-n", "default"],
                                       env=env, stdout=subprocess.PIPE)
            gz = subprocess.Popen(["gzip", "-1"], stdin=kubectl.stdout, stdout=fh)
            kubectl.stdout.close()
            if gz.wait() != 0 or kubectl.wait() != 0:
                raise RuntimeError(f"kubectl logs {name} | gzip failed")
    return time.monotonic() - started


def _archive(kc: str, out: Path, *args: str) -> dict:
    """One `steptail archive`, sampled every 20 ms: wall time, peak RSS (archive, kubectl)."""
    env = {**os.environ, "KUBECONFIG": kc, "CLOUDSDK_CORE_ACCOUNT": ACCOUNT}
    started = time.monotonic()
    proc = subprocess.Popen([*CLI, "archive", "--jobset", JOBSET, "--out", str(out), "-o", "json", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    me = psutil.Process(proc.pid)
    peak = kube_sum = kube_max = 0
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            peak = max(peak, me.memory_info().rss)
            kids = []
            for c in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if c.name() == "kubectl":
                        kids.append(c.memory_info().rss)
            kube_sum, kube_max = max(kube_sum, sum(kids)), max([kube_max, *kids])
        time.sleep(0.02)
    stdout, stderr = proc.communicate()
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"archive failed ({proc.returncode}): {stderr.strip()}")
    return {"wall_s": round(wall, 2), "peak_rss_mb": round(peak / 2**20, 1),
            "kubectl_peak_rss_sum_mb": round(kube_sum / 2**20, 1),
            "kubectl_peak_rss_max_mb": round(kube_max / 2**20, 1), "summary": json.loads(stdout)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=32, help="a multiple of 8 (slices of 8 hosts)")
    ap.add_argument("--mb", type=float, default=20.0, help="MB of log per pod")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    scenario = {"rate": 20, "log_max_size": "4Gi", "grace_seconds": 600,
                "jobsets": [{"name": JOBSET, "slices": a.pods // 8, "hosts": 8, "trainer": {"steps": 10}}],
                "faults": [{"at_step": 1, "action": "flood", "bytes": int(a.mb * 1e6), "all_pods": True}]}
    with tempfile.TemporaryDirectory() as d, _sim_process(scenario, Path(d)) as kc:
        names = _wait_done(kc, a.pods)
        seq = _sequential(kc, names)
        seq_gz = _sequential_gzip(kc, names, Path(d) / "by-hand")
        first = _archive(kc, Path(d) / "a", "--no-ingest")
        again = _archive(kc, Path(d) / "a", "--no-ingest")
        ingest = _archive(kc, Path(d) / "b", "--db", str(Path(d) / "s.db"))
    s = first["summary"]
    report = {
        "pods": a.pods, "cpus": os.cpu_count(), "log_mb_total": round(s["bytes"] / 1e6, 1),
        "gzip_ratio": round(s["bytes"] / max(1, s["bytes_compressed"]), 2),
        "sequential_kubectl_s": round(seq, 2), "sequential_kubectl_gzip_s": round(seq_gz, 2),
        "archive_s": first["wall_s"],
        "speedup": round(seq / first["wall_s"], 2),
        "archive_mb_per_s": round(s["bytes"] / 1e6 / first["wall_s"], 1),
        "archive_peak_rss_mb": first["peak_rss_mb"],
        "kubectl_peak_rss_sum_mb": first["kubectl_peak_rss_sum_mb"],
        "kubectl_peak_rss_max_mb": first["kubectl_peak_rss_max_mb"],
        "resume_noop_s": again["wall_s"], "resume_read": again["summary"]["read"],
        "archive_with_ingest_s": ingest["wall_s"], "archive_with_ingest_peak_rss_mb": ingest["peak_rss_mb"],
        "ingested_lines": (ingest["summary"]["ingest"] or {}).get("lines"),
    }
    print(json.dumps(report, indent=None if a.json else 2))


if __name__ == "__main__":
    main()
