"""deploy/Containerfile built and run: deploy/build-image.sh builds the image as CI does (Debian
bases from mmdebstrap imported as local images, the machine's own kubectl, buildah with a vfs
storage of its own; no registry), once for this module, and one container runs as the Deployment
runs it — user 65532, read-only root, /tmp a tmpfs, every capability dropped — following a
JobSet of the simulated cluster into a SQLite store on a mounted volume, every step once.

Needs root, mmdebstrap, podman, buildah and runc (Debian packages; .ci/run installs them) and
PyPI (the image's `pip install`); skipped without them, except when $CI is set: there a missing
tool fails the module (CI must not skip it silently). The build takes ~6 minutes (12 on a busy 2-core
machine) and ~2 GB of scratch, removed at the end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from test_follow_support import assert_exactly_once, reconnects, scenario

from steptail.simcluster import kube
from steptail.simcluster.cluster import SimCluster

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "deploy" / "build-image.sh"
TAG = "localhost/steptail:test"
UID = "65532"  # deploy/Containerfile's USER and deploy/deployment.yaml's runAsUser
TOOLS = ("mmdebstrap", "podman", "buildah", "runc")
JOBSET, RATE, STEPS = "olmo3-sft", 50, 450  # 9 s, started once the container follows


def _why_not() -> str:
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        return f"needs {', '.join(missing)} (apt-get install {' '.join(missing)}) to build the image"
    if os.geteuid() != 0:
        return "needs root: mmdebstrap, podman import and buildah run as root here"
    return ""


WHY_NOT = _why_not()
pytestmark = [
    pytest.mark.image,  # .ci/run: its own step (make test-image), timed apart from make test
    pytest.mark.skipif(bool(WHY_NOT) and not os.environ.get("CI"), reason=WHY_NOT),
    pytest.mark.timeout(1800),  # the first test builds the image (5 to 12 min here)
]


@pytest.fixture(scope="module")
def engine():
    """The image, built once by deploy/build-image.sh into a scratch storage; yields the
    environment podman needs to use that storage. The scratch goes at the end."""
    if WHY_NOT:  # only reached with $CI set: CI must build and run the image
        pytest.fail(f"$CI is set and this machine cannot build the image: {WHY_NOT}")
    scratch = Path(tempfile.mkdtemp(prefix="steptail-image-"))
    try:
        done = subprocess.run([str(BUILD), "--tag", TAG, "--scratch", str(scratch), "--keep"],
                              capture_output=True, text=True, timeout=1500)
        assert done.returncode == 0, f"build-image.sh failed ({done.returncode}):\n{done.stderr[-6000:]}"
        yield {**os.environ, "CONTAINERS_STORAGE_CONF": str(scratch / "storage.conf"),
               "CONTAINERS_CONF": str(scratch / "containers.conf"), "TMPDIR": str(scratch / "tmp")}
    finally:
        if (scratch / "storage.conf").exists():
            subprocess.run([str(BUILD), "--remove", str(scratch)], check=False, timeout=300)
        shutil.rmtree(scratch, ignore_errors=True)  # a build that failed before its storage
        assert not scratch.exists()


def run_argv(name: str, *args: str, network: str = "none") -> list[str]:
    """`podman run` as the Deployment runs the container: user 65532, read-only root with only
    /tmp writable (a tmpfs, as its emptyDir), no capabilities, no privilege escalation. runc (crun
    fails on this machine's hybrid cgroups), and no podman network (netavark adds iptables chains):
    none, or host to reach a server on 127.0.0.1."""
    return ["podman", "run", "--rm", "--name", name, "--runtime", "runc", f"--network={network}",
            "--ulimit", "nofile=1024:20000", "--ulimit", "nproc=1024:1024",
            "--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp:rw,size=256m,mode=1777",
            "--user", f"{UID}:{UID}", "--cap-drop", "all", "--security-opt", "no-new-privileges", *args]


def remove_container(engine, name: str) -> None:
    """A run cut short (a timeout) leaves no container behind."""
    subprocess.run(["podman", "rm", "--force", "--ignore", name], env=engine,
                   capture_output=True, check=False, timeout=60)


@pytest.fixture(scope="module")
def followed(engine, tmp_path_factory):
    """One container (each run copies the whole image on vfs: up to a minute on a busy machine)
    running `steptail follow --all` as deploy/ runs it, against a simulated cluster whose API
    (TLS, on the host's 127.0.0.1: host network) it reaches with the simulator's kubeconfig, exec
    credential plugin and credential files mounted read-only; the store (SQLite) and Parquet on a
    writable volume. Once its probe paths answer, a shell in the container looks around; then
    the JobSet starts, with a log rotation (the stream hangs) and an EOF of every stream."""
    tmp = tmp_path_factory.mktemp("followed")
    sim = SimCluster(scenario(jobsets=[]), state_dir=tmp / "sim")
    sim.start_in_thread()
    name = f"steptail-test-{uuid.uuid4().hex[:8]}"
    proc = None
    try:
        # The simulator's kubeconfig runs its auth plugin with this venv's Python; in the
        # container it is the image's Python and the mounted files.
        config = yaml.safe_load(sim.kubeconfig_path.read_text())
        (user,) = config["users"]
        user["user"]["exec"].update(command="/opt/steptail/bin/python",
                                    args=["-I", "-S", "/sim/authplugin.py", "--state-dir", "/sim/state"])
        kubeconfig = tmp / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
        kubeconfig.chmod(0o644)
        data = tmp / "data"
        data.mkdir()
        os.chown(data, int(UID), int(UID))
        mounts = [(kubeconfig, "/sim/kubeconfig"), (kube.PLUGIN, "/sim/authplugin.py"),
                  (sim.state_dir / "token", "/sim/state/token"),
                  (sim.state_dir / "lapse_until", "/sim/state/lapse_until")]
        port = free_port()
        args = ["-e", f"CLOUDSDK_CORE_ACCOUNT={sim.account}", "-v", f"{data}:/data:rw",
                *[a for host, inside in mounts for a in ("-v", f"{host}:{inside}:ro")],
                TAG, "follow", "--all", f"--namespace={sim.namespace}", "--kubeconfig=/sim/kubeconfig",
                "--db=/data/steptail.db", "--parquet=/data/parquet", f"--metrics-port={port}",
                "--metrics-host=127.0.0.1", "--log-format=json", "--no-view", "--until-done", "--silence=1"]
        proc = subprocess.Popen(run_argv(name, *args, network="host"), env=engine,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        probed = {path: wait_for_200(proc, f"http://127.0.0.1:{port}{path}", timeout=300)
                  for path in ("/healthz", "/livez")}
        looked = subprocess.run(["podman", "exec", name, "/bin/sh", "-c", LOOK], env=engine,
                                capture_output=True, text=True, timeout=120)
        sim.add_jobset({"name": JOBSET, "hosts": 2, "rate": RATE,
                        "trainer": {"steps": STEPS, "checkpoint_period": 100}})
        sim.wait_step(STEPS // 3, JOBSET, timeout=60)
        # the rotation once a read served that step: the follower in the container first read
        # the JobSet after step 150's rotation in one CI run (2026-12-07), its head then lost
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(t.served for t in sim.truth(JOBSET) if t.step == STEPS // 3):
            time.sleep(0.05)
        sim.rotate(JOBSET)
        sim.wait_step(2 * STEPS // 3, JOBSET, timeout=60)
        sim.eof_streams()
        out, err = proc.communicate(timeout=180)
        yield SimpleNamespace(sim=sim, db=str(data / "steptail.db"), data=data, returncode=proc.returncode,
                              err=err, probed=probed, looked=looked)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        remove_container(engine, name)
        sim.stop_thread()


# What a shell in the running container sees: who runs PID 1 (tini, then steptail), the real
# kubectl (not gcloud's dispatcher, which needs the SDK beside it) and the auth plugin, run alone
# as the image's user; / read-only, /tmp and /data not; the C extension, and no compiler.
LOOK = ("kubectl version --client -o json > /tmp/kubectl.json && cat /tmp/kubectl.json;"
        " gke-gcloud-auth-plugin --version; echo plugin=$?;"
        " echo uid=$(id -u) gid=$(id -g) pid1=$(awk '/^Uid:/ {print $2}' /proc/1/status);"
        " echo x > /probe; echo root=$?; echo x > /tmp/probe; echo tmp=$?;"
        " echo x > /data/probe; echo data=$?; rm -f /data/probe;"
        " command -v gcc cc; echo cc=$?;"
        " /opt/steptail/bin/python -c 'import steptail.parsers._steady'; echo ext=$?")


def test_the_container_runs_kubectl_as_65532_on_a_read_only_root_without_a_compiler(followed):
    done = followed.looked
    assert done.returncode == 0, done.stderr
    body, _, rest = done.stdout.partition("\n}\n")
    version = json.loads(body + "}")["clientVersion"]["gitVersion"]
    assert version.startswith("v1.") and "dispatcher" not in version, version
    words = set(rest.split())
    assert "plugin=0" in words, (done.stdout, done.stderr)
    assert {f"uid={UID}", f"gid={UID}", f"pid1={UID}"} <= words, done.stdout
    assert "root=0" not in words and "Read-only file system" in done.stderr, (done.stdout, done.stderr)
    assert {"tmp=0", "data=0", "ext=0"} <= words, (done.stdout, done.stderr)
    assert "cc=0" not in words, done.stdout  # the compiler stayed in the build stage


def test_follow_in_the_container_records_every_step_once(followed):
    assert followed.returncode == 0, followed.err[-4000:]
    assert all(followed.probed.values()), (followed.probed, followed.err[-3000:])
    assert "read-only file system" not in followed.err.lower(), followed.err[-3000:]
    result = assert_exactly_once(followed.sim, followed.db, JOBSET, JOBSET)
    assert not result["lost"] and sorted(s for _, s in result["got"]) == list(range(1, STEPS + 1))
    reasons = dict(reconnects(followed.db, JOBSET))
    assert reasons.get("silence", 0) >= 1 and reasons.get("eof", 0) >= 1, reasons  # kubectl, reopened
    assert list((followed.data / "parquet").rglob("*.parquet"))
    assert {p.stat().st_uid for p in followed.data.rglob("*")} == {int(UID)}  # the image's user wrote them


def wait_for_200(proc: subprocess.Popen, url: str, timeout: float) -> bool:
    """Whether `url` answered 200 before the process ended (a 503 or no answer yet: retry)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            time.sleep(0.2)
    return False


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
