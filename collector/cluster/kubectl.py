"""`kubectl logs` as an asyncio subprocess: argv (never a shell string), environment, stderr
classification, and killing by process group on every exit path."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from dataclasses import dataclass

from steptail.collector.notify.health import mask
from steptail.parsers.timestamps import format_ns

ACCOUNT_VAR = "CLOUDSDK_CORE_ACCOUNT"
LINE_LIMIT = 1 << 21  # StreamReader limit: longer than any line the model keeps (1 MiB)
# kubectl holds a whole line before printing it (and more, while its buffer doubles): a line
# with no end grows it without bound (400 MB of line: 867 MB of kubectl). Past this resident
# size it is killed; the follower skips the line (FollowConfig.kubectl_max_rss).
MAX_RSS = 256 << 20
OVERSIZED = -9  # run_once's exit code when it killed kubectl for growing past max_rss

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
        argv = [self.kubectl, "logs", pod, "-c", container, "--timestamps", "-n", self.namespace]
        if self.kubeconfig:
            argv.append(f"--kubeconfig={self.kubeconfig}")
        if self.context:
            argv.append(f"--context={self.context}")
        if follow:
            argv.append("-f")
        if previous:
            argv.append("--previous")
        if since_ns is not None:
            argv.append(f"--since-time={format_ns(since_ns)}")
        if limit_bytes is not None:
            argv.append(f"--limit-bytes={limit_bytes}")
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
        await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        pass
    LIVE.pop(proc.pid, None)
    return proc.returncode


def kill_all() -> None:
    """Last resort on exit: no kubectl outlives the collector."""
    for pid in list(LIVE):
        kill_group(pid)
        LIVE.pop(pid, None)


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a process (Linux /proc/PID/statm: half the cost of status), None
    when unknown."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return None


PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class SizeWatch:
    """Kills a kubectl that grows past max_rss: it is holding a line with no end (it prints a
    line only whole). One task per event loop looks at every kubectl watched, every INTERVAL
    s (a few µs each): the overshoot is what kubectl grows in that time, whatever the stream
    does. `rss`: how big it was when killed (None: not killed)."""

    INTERVAL = 0.1
    _watched: dict[int, SizeWatch] = {}
    _task: asyncio.Task | None = None

    def __init__(self, proc: asyncio.subprocess.Process, max_rss: int | None) -> None:
        self.proc, self.max_rss, self.rss = proc, max_rss, None
        if not max_rss:
            return
        SizeWatch._watched[proc.pid] = self
        task = SizeWatch._task
        if task is None or task.done() or task.get_loop() is not asyncio.get_running_loop():
            SizeWatch._task = asyncio.get_running_loop().create_task(SizeWatch._watch())

    @property
    def why(self) -> str:
        return f"kubectl grew to {self.rss >> 20} MiB holding one line (limit {self.max_rss >> 20} MiB)"

    def close(self) -> None:
        if SizeWatch._watched.get(self.proc.pid) is self:
            del SizeWatch._watched[self.proc.pid]

    @classmethod
    async def _watch(cls) -> None:
        while cls._watched:
            await asyncio.sleep(cls.INTERVAL)
            for pid, w in list(cls._watched.items()):
                rss = rss_bytes(pid) if w.proc.returncode is None else None
                if rss is not None and rss > w.max_rss:
                    w.rss = rss
                    kill_group(pid)  # its stdout ends: the reader sees EOF, then asks `rss`
                    w.close()


async def run_once(argv: list[str], env: dict[str, str], line_cb, timeout: float, *,
                   max_rss: int | None = None, on_overlong=None) -> tuple[int | None, str]:
    """A non-follow read (drain, --previous): every stdout line to line_cb; (exit code, stderr).
    A line over LINE_LIMIT is on_overlong() (its rest arrives as fragments); kubectl grown past
    max_rss is killed: (OVERSIZED, why)."""
    proc = await spawn(argv, env)
    size = SizeWatch(proc, max_rss)
    err_task = asyncio.create_task(proc.stderr.read())
    try:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    line = await proc.stdout.readline()
                except ValueError:  # over the reader's limit
                    if on_overlong is not None:
                        on_overlong()
                    continue
                if not line:
                    break
                line_cb(line)
            code = await proc.wait()
        if size.rss is not None:
            return OVERSIZED, size.why
        return code, (await err_task).decode("utf-8", "replace")
    except TimeoutError:
        return None, "timed out reading the log"
    finally:
        size.close()
        await stop(proc)
        if not err_task.done():
            err_task.cancel()
