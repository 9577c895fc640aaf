"""The `kubernetes` API client as the collector uses it.

- Built from the kubeconfig (`--kubeconfig`, else $KUBECONFIG, else ~/.kube/config), or in a
  pod without one from its ServiceAccount. `check()` validates the file and the context up
  front, without running anything, so a bad one is one line at start-up.
- The exec credential plugin runs in the environment kubectl gets (KubeTarget.env(): the
  target's account), not through os.environ; its failure is kept as the reason of the 401
  it causes, not logged on the root logger as the library does.
- The plugin never shares our terminal (_Provider): the library's provider, when stdout is
  a terminal, hands it our stdin and stderr, so gcloud's message lands on the screen (inside
  the live view) and the failure reads `'NoneType' object has no attribute 'strip'`. Ours
  always captures its stderr, which becomes the reason, and runs it non-interactive (stdin
  /dev/null: a collector cannot answer a prompt), as kubectl runs it for `follow`.
- Requests fail fast: the callers' loops retry with backoff and report each change of state
  once, where urllib3's own retries would log a warning per attempt."""

from __future__ import annotations

import json
import os
import subprocess
import time

import yaml
from kubernetes.client import ApiClient, Configuration
from kubernetes.config import ConfigException, load_incluster_config
from kubernetes.config.dateutil import parse_rfc3339
from kubernetes.config.exec_provider import ExecProvider
from kubernetes.config.kube_config import FileOrData, KubeConfigLoader, KubeConfigMerger
from urllib3.util.retry import Retry

from steptail.collector.cluster.kubectl import KubeTarget, classify, in_cluster

# No retry of a refused connection or an error status; one of a read, for a pooled
# connection the server closed meanwhile (a one-off, not a failure worth a log line).
# A 429 or 503 with Retry-After reaches the caller as the API's answer (ApiException, its
# headers): urllib3 would otherwise take it for a retry, find none left and raise a
# MaxRetryError without the wait the server named, read as a network failure (issue 33).
RETRIES = Retry(total=1, connect=0, read=1, redirect=0, status=0, other=0, respect_retry_after_header=False)


class KubeconfigError(Exception):
    """The kubeconfig is missing, unreadable or invalid, or has no such context."""


_exec_failure: tuple[float, str] | None = None  # (monotonic, reason) of the last plugin failure


def exec_failure(within: float = 30.0) -> str | None:
    """Why the exec credential plugin last failed, if it did within `within` seconds."""
    last = _exec_failure
    return last[1] if last is not None and time.monotonic() - last[0] < within else None


def _note_exec_failure(message: str) -> None:
    global _exec_failure
    _exec_failure = (time.monotonic(), f"exec credential plugin failed: {classify(message)[1]}")


class _Provider(ExecProvider):
    """The library's ExecProvider, whatever stdout and stderr are: the plugin's stderr is
    captured (the message of its failure), its stdin is /dev/null and the ExecCredential it
    gets says `interactive: false`."""

    def run(self, previous_response=None):
        spec: dict = {"interactive": False}
        if previous_response:
            spec["response"] = previous_response
        if self.cluster:
            spec["cluster"] = dict(self.cluster.value)
            for extension in self.cluster.value.get("extensions") or []:
                if extension.get("name") == "client.authentication.k8s.io/exec":
                    spec["cluster"]["config"] = extension.get("extension")
                    break
        env = {**self.env, "KUBERNETES_EXEC_INFO": json.dumps(
            {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": spec})}
        try:
            proc = subprocess.run(self.args, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  cwd=self.cwd, env=env, shell=self.shell, check=False)
        except OSError as exc:
            raise ConfigException(f"exec: cannot run {self.args[0]}: {exc.strerror or exc}") from None
        if proc.returncode != 0:
            stderr = (proc.stderr or "").strip()
            raise ConfigException(f"exec: process returned {proc.returncode}" + (f". {stderr}" if stderr else ""))
        try:
            data = json.loads(proc.stdout)
        except ValueError as exc:
            raise ConfigException(f"exec: failed to decode process output: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigException("exec: malformed response: not an object")
        for key in ("apiVersion", "kind", "status"):
            if key not in data:
                raise ConfigException(f"exec: malformed response. missing key '{key}'")
        if data["apiVersion"] != self.api_version:
            raise ConfigException(f"exec: plugin api version {data['apiVersion']} does not match {self.api_version}")
        return data["status"]


class _Loader(KubeConfigLoader):
    """The library's loader, but the plugin runs in kubectl's environment and its failure is
    kept (see exec_failure) instead of logged."""

    env: dict[str, str] | None = None  # the target's (KubeTarget.env()); None: os.environ

    def _load_from_exec_plugin(self):
        if not self._user or "exec" not in self._user:
            return None
        base = self._get_base_path(self._cluster.path)
        try:
            exec_config = self._user["exec"]
            provider = _Provider(exec_config, base, self._cluster)
            if self.env is not None:  # the kubeconfig's own `env` entries still win, as in kubectl
                provider.env = {**self.env, **{e["name"]: e["value"] for e in exec_config.safe_get("env") or []}}
            status = provider.run()
        except Exception as exc:  # noqa: BLE001 - any plugin failure: no credentials, a 401 follows
            _note_exec_failure(str(exc))
            return None
        if "token" in status:
            self.token = f"Bearer {status['token']}"
        elif "clientCertificateData" in status and "clientKeyData" in status:
            self.cert_file = FileOrData(status, None, data_key_name="clientCertificateData", file_base_path=base,
                                        base64_file_content=False, temp_file_path=self._temp_file_path).as_file()
            self.key_file = FileOrData(status, None, data_key_name="clientKeyData", file_base_path=base,
                                       base64_file_content=False, temp_file_path=self._temp_file_path).as_file()
        else:
            _note_exec_failure("exec: the plugin's output has neither a token nor a client certificate and key")
            return None
        if "expirationTimestamp" in status:
            self.expiry = parse_rfc3339(status["expirationTimestamp"])
        return True


def _location(target: KubeTarget) -> str:
    return target.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"


def _loader(target: KubeTarget) -> _Loader:
    where = _location(target)
    files = [os.path.expanduser(p) for p in where.split(os.pathsep) if p]
    for f in files:
        if os.path.exists(f) and not os.access(f, os.R_OK):
            raise KubeconfigError(f"cannot read kubeconfig {f}: permission denied")
    if not any(os.path.isfile(f) for f in files):
        raise KubeconfigError(f"no kubeconfig at {where}: pass --kubeconfig or set KUBECONFIG")
    try:
        merged = KubeConfigMerger(where).config
        if merged is None:
            raise ConfigException("no configuration found")
        contexts = merged.safe_get("contexts") or []
        names = [c["name"] for c in contexts if "name" in c]
        wanted = target.context or merged.safe_get("current-context")
        if target.context and target.context not in names:
            raise KubeconfigError(f'context "{target.context}" is not in kubeconfig {where} '
                                  f"(contexts: {', '.join(names) or 'none'})")
        if not wanted:
            raise KubeconfigError(f"kubeconfig {where} has no current-context: pass --context")
        loader = _Loader(merged, active_context=wanted, config_base_path=None)
        if not loader._cluster.safe_get("server"):
            raise ConfigException(f'cluster of context "{wanted}" has no server')
    except KubeconfigError:
        raise
    except yaml.YAMLError as exc:
        raise KubeconfigError(f"kubeconfig {where} is not valid YAML: {_first_line(exc)}") from None
    except ConfigException as exc:
        raise KubeconfigError(f"invalid kubeconfig {where}: {_first_line(exc)}") from None
    except OSError as exc:
        raise KubeconfigError(f"cannot read kubeconfig {where}: {exc.strerror or exc}") from None
    except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a file of the wrong shape
        raise KubeconfigError(f"invalid kubeconfig {where}: {type(exc).__name__}: {_first_line(exc)}") from None
    loader.env = target.env()
    return loader


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().removeprefix("Invalid kube-config file. ")
    return (text.splitlines() or [""])[0][:300]


def check(target: KubeTarget) -> None:
    """Raise KubeconfigError when the client could not be configured (missing or invalid
    kubeconfig, unknown context); runs no plugin, opens no connection."""
    if in_cluster(target.kubeconfig):
        try:
            load_incluster_config(client_configuration=Configuration())
        except ConfigException as exc:
            raise KubeconfigError(f"no kubeconfig and no usable ServiceAccount in this pod: {_first_line(exc)}") from None
        return
    _loader(target)


def api_client(target: KubeTarget) -> ApiClient:
    """A client for the target; raises KubeconfigError (or ConfigException in a pod without
    a ServiceAccount token)."""
    cfg = Configuration()
    if in_cluster(target.kubeconfig):
        load_incluster_config(client_configuration=cfg)
    else:
        _loader(target).load_and_set(cfg)
    cfg.retries = RETRIES
    return ApiClient(cfg)
