"""kubectl reading a pod's log as an asyncio subprocess: argv (never a shell string),
environment, stderr classification, the bound on one line, and killing by process group on
every exit path.

A log is read with `kubectl get --raw` on the pods/log subresource: the very request `kubectl
logs` ends with, alone. `kubectl logs` first asks for the API's discovery documents (when its
cache is cold) and the pod, in series: up to seven requests, 12 s before the first line under a
2 s-slow API, where the raw read is one round trip. The body is the same bytes, streamed as they
come (no whole line held: a line with no end does not grow kubectl), and the errors read the
same ("Error from server (NotFound): ...")."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from urllib.parse import quote, urlencode

from steptail.collector.notify.health import mask

ACCOUNT_VAR = "CLOUDSDK_CORE_ACCOUNT"
LINE_LIMIT = 1 << 21  # StreamReader limit: longer than any line the model keeps (1 MiB)
# A line longer than this has no end worth waiting for: what the pod prints after it continues
# it on the wire. The read stops and the follower skips the line (FollowConfig.max_line_bytes).
MAX_LINE = 256 << 20
OVERSIZED = -9  # run_once's exit code when it stopped inside a line longer than max_line

# Every kubectl this process started and has not reaped yet: pid -> process.
LIVE: dict[int, asyncio.subprocess.Process] = {}


class AccountMissing(Exception):
    """No account for kubectl / the auth plugin: refuse to start."""


class KubectlMissing(FileNotFoundError):
    """kubectl cannot be started (removed from PATH, not executable): a failing state of the
    follower, retried, not a crash."""


def in_cluster(kubeconfig: str | None = None) -> bool:
    """A pod with a ServiceAccount and no kubeconfig (deploy/): kubectl and the API client use
    the ServiceAccount's token, no Google account and no auth plugin."""
    return (not kubeconfig and not os.environ.get("KUBECONFIG")
            and not os.path.exists(os.path.expanduser("~/.kube/config"))
            and bool(os.environ.get("KUBERNETES_SERVICE_HOST")))


def resolve_account(account: str | None, kubeconfig: str | None = None) -> str:
    """The Google account kubectl's auth plugin runs as; "" in a pod using its ServiceAccount."""
    value = account or os.environ.get(ACCOUNT_VAR)
    if not value and in_cluster(kubeconfig):
        return ""
    if not value:
        raise AccountMissing(
            f"no account: pass --account or set {ACCOUNT_VAR} to the agent service account "
            "(without it the GKE auth plugin falls back to a user login that lapses daily)"
        )
    return value


# The environment kubectl, gke-gcloud-auth-plugin and gcloud use: kubeconfig and account, home
# and caches, proxies and CA bundles, locale, the in-cluster service address, Google credentials.
CHILD_ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "TZ", "LANG", "LANGUAGE", "KUBECONFIG",
    "USE_GKE_GCLOUD_AUTH_PLUGIN", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT",
})
CHILD_ENV_PREFIXES = ("CLOUDSDK_", "LC_", "XDG_", "KUBECTL_", "GCE_METADATA_")


def child_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The allowed part of `environ` (default os.environ) for kubectl and its auth plugin."""
    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items()
            if (k in CHILD_ENV_NAMES or k.startswith(CHILD_ENV_PREFIXES)) and not k.startswith("STEPTAIL_")}


@dataclass(frozen=True)
class KubeTarget:
    """Where and as whom kubectl talks: passed through to every kubectl call."""

    namespace: str
    account: str
    kubeconfig: str | None = None
    context: str | None = None
    kubectl: str = "kubectl"

    def env(self) -> dict[str, str]:
        """What kubectl and its auth plugin need, nothing else: never $STEPTAIL_DB (it may hold
        the database password) or any other STEPTAIL_* secret."""
        env = child_env()
        if self.account:  # "" in a pod on its ServiceAccount: no auth plugin runs
            env[ACCOUNT_VAR] = self.account
        if self.kubeconfig:
            env["KUBECONFIG"] = self.kubeconfig
        return env

    def logs_argv(self, pod: str, container: str, *, follow: bool = False, since_ns: int | None = None,
                  previous: bool = False, limit_bytes: int | None = None) -> list[str]:
        """`kubectl get --raw` of the pod's log: what `kubectl logs POD -c C --timestamps
        [-f] [--previous] [--since-time] [--limit-bytes]` asks for, in one request."""
        query: dict[str, str] = {"container": container, "timestamps": "true"}
        if follow:
            query["follow"] = "true"
        if previous:
            query["previous"] = "true"
        if since_ns is not None:  # whole seconds, as kubectl logs --since-time sends it
            query["sinceTime"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since_ns // 1_000_000_000))
        if limit_bytes is not None:
            query["limitBytes"] = str(limit_bytes)
        path = f"/api/v1/namespaces/{quote(self.namespace, safe='')}/pods/{quote(pod, safe='')}/log"
        argv = [self.kubectl, "get", "--raw", f"{path}?{urlencode(query)}"]
        if self.kubeconfig:
            argv.append(f"--kubeconfig={self.kubeconfig}")
        if self.context:
            argv.append(f"--context={self.context}")
        return argv


# ---- stderr classification -----------------------------------------------------------------

AUTH = "auth"
NOT_FOUND = "not_found"
CONTAINER_CREATING = "container_creating"
NO_PREVIOUS = "no_previous"
SERVER_ERROR = "server_error"
NETWORK = "network"
OTHER = "other"

_RULES = (
    (AUTH, re.compile(r"getting credentials|exec: |Unauthorized|gcloud auth login|credential|"
                      r"\(Forbidden\)|forbidden", re.I)),
    (NO_PREVIOUS, re.compile(r"previous terminated container .* not found", re.I)),
    (CONTAINER_CREATING, re.compile(r"waiting to start|ContainerCreating|PodInitializing", re.I)),
    (NOT_FOUND, re.compile(r"\(NotFound\)|not found", re.I)),
    (SERVER_ERROR, re.compile(r"InternalError|ServiceUnavailable|Timeout|TooManyRequests|"
                              r"an error on the server|unable to handle|\b5\d\d\b", re.I)),
    (NETWORK, re.compile(r"Unable to connect|connection refused|connection reset|EOF|"
                         r"i/o timeout|no route|TLS", re.I)),
)
# kubectl (client-go) honours a 429's Retry-After by itself, up to ten times; when it gives up
# it prints no wait. API Priority and Fairness and the max-in-flight filter always ask for 1 s.
THROTTLED_WAIT_S = 1.0
_THROTTLED = re.compile(r"TooManyRequests|Too Many Requests|\(429\)|too many requests", re.I)


def throttled_wait(reason: str) -> float | None:
    """The wait a throttled request's answer asked for (THROTTLED_WAIT_S), None when `reason`
    (kubectl's stderr or its one-line reason) is not a 429."""
    return THROTTLED_WAIT_S if _THROTTLED.search(reason) else None


def classify(stderr: str) -> tuple[str, str]:
    """(kind, one-line reason) for kubectl's stderr; tokens are masked."""
    text = mask(stderr.strip())
    kind = OTHER
    for k, rx in _RULES:
        if rx.search(text):
            kind = k
            break
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # the most telling line: the gcloud ERROR for auth, else kubectl's error line, else the last
    pick = next((ln for ln in lines if ln.startswith("ERROR:")), None) if kind == AUTH else None
    pick = pick or next((ln for ln in lines if ln.lower().startswith(("error", "unable"))), None)
    pick = pick or (lines[-1] if lines else "kubectl exited without a message")
    return kind, pick[:300]


# ---- processes -----------------------------------------------------------------------------


def die_with_parent() -> None:
    """In a child process: SIGKILL when its parent dies, even by SIGKILL (Linux)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the pipe closing still ends kubectl
        pass


async def spawn(argv: list[str], env: dict[str, str]) -> asyncio.subprocess.Process:
    """Start kubectl in its own process group (the auth plugin it runs dies with it)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True, limit=LINE_LIMIT,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )
    except (FileNotFoundError, PermissionError) as exc:
        raise KubectlMissing(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
    LIVE[proc.pid] = proc
    return proc


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def stop(proc: asyncio.subprocess.Process, timeout: float = 5.0) -> int | None:
    """Kill the process group of one kubectl (by its PID) and reap it."""
    if proc.returncode is None:
        kill_group(proc.pid)
    try:
        async with asyncio.timeout(timeout):  # not wait_for: on 3.11 it can swallow a cancel
            await proc.wait()
    except TimeoutError:
        pass
    LIVE.pop(proc.pid, None)
    return proc.returncode


def kill_all() -> None:
    """Last resort on exit: no kubectl outlives the collector."""
    for pid in list(LIVE):
        kill_group(pid)
        LIVE.pop(pid, None)


class LongLine:
    """The line being read, when it is longer than the reader's limit (it arrives as
    fragments): past `max_bytes` it has no end worth waiting for, and the read stops."""

    def __init__(self, max_bytes: int | None) -> None:
        self.max_bytes, self.bytes = max_bytes, 0

    def grew(self) -> bool:
        """One more over-limit fragment of it (the reader drops about LINE_LIMIT bytes at a
        time); True when it is past max_bytes."""
        self.bytes += LINE_LIMIT
        return self.max_bytes is not None and self.bytes > self.max_bytes

    @property
    def first(self) -> bool:
        """The fragment just dropped was the line's first."""
        return self.bytes == LINE_LIMIT

    def ended(self) -> None:
        self.bytes = 0

    @property
    def why(self) -> str:
        return f"one line longer than {self.max_bytes >> 20} MiB"


async def run_once(argv: list[str], env: dict[str, str], line_cb, timeout: float, *,
                   max_line: int | None = None, on_overlong=None) -> tuple[int | None, str]:
    """A non-follow read (drain, --previous): every stdout line to line_cb; (exit code, stderr).
    A line over LINE_LIMIT is on_overlong() (its rest arrives as fragments); one longer than
    max_line stops the read: (OVERSIZED, why)."""
    proc = await spawn(argv, env)
    long = LongLine(max_line)
    err_task = asyncio.create_task(proc.stderr.read())
    try:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    line = await proc.stdout.readline()
                except ValueError:  # over the reader's limit
                    if long.grew():
                        return OVERSIZED, long.why
                    if long.first and on_overlong is not None:
                        on_overlong()
                    continue
                if not line:
                    break
                long.ended()
                line_cb(line)
            code = await proc.wait()
        return code, (await err_task).decode("utf-8", "replace")
    except TimeoutError:
        return None, "timed out reading the log"
    finally:
        await stop(proc)
        if not err_task.done():
            err_task.cancel()
