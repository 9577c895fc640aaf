"""Simulated gke-gcloud-auth-plugin: a client.authentication.k8s.io/v1beta1 exec credential
plugin. Standard library only (it runs with `python -I -S`).

Prints an ExecCredential with the simulator's token, or fails like the GKE plugin (exit 1,
a message on stderr) when CLOUDSDK_CORE_ACCOUNT is unset or during a simulated login lapse
(the simulator writes the lapse deadline, epoch seconds, to STATE_DIR/lapse_until)."""

import base64
import datetime
import json
import os
import sys
import time


def _fail(detail: str) -> None:
    now = datetime.datetime.now(datetime.UTC)
    sys.stderr.write(
        f"E{now:%m%d %H:%M:%S}.{now.microsecond:06d} {os.getpid()} cred.go:145] "
        "print credential failed with error: Failed to retrieve access token:: failure while "
        "executing gcloud, with args [config config-helper --format=json]: exit status 1\n"
        f"ERROR: (gcloud.config.config-helper) {detail}\n"
        "Please run:\n\n  $ gcloud auth login\n\nto obtain new credentials, or set "
        "CLOUDSDK_CORE_ACCOUNT to a service account with an active credential.\n"
        "(simulated gke-gcloud-auth-plugin: error getting credentials)\n"
    )
    sys.exit(1)


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def main() -> None:
    args = sys.argv[1:]
    state = args[args.index("--state-dir") + 1] if "--state-dir" in args else "."
    if not os.environ.get("CLOUDSDK_CORE_ACCOUNT"):
        _fail(
            "You do not currently have an active account selected. CLOUDSDK_CORE_ACCOUNT is "
            "not set and the user login has lapsed; reauthentication failed: cannot prompt "
            "during non-interactive execution."
        )
    try:
        with open(os.path.join(state, "lapse_until")) as f:
            until = float(f.read().strip() or 0)
    except (OSError, ValueError):
        until = 0.0
    if time.time() < until:
        _fail(
            "There was a problem refreshing your current auth tokens: Reauthentication failed. "
            "cannot prompt during non-interactive execution."
        )
    try:
        with open(os.path.join(state, "token")) as f:
            token = f.read().strip()
    except OSError as e:
        _fail(f"could not read the simulated credential store: {e}")
    # an hour, as a Google access token: clients cache it (the kubernetes client renews one that
    # has less than 5 minutes left, so a shorter life would run the plugin on every request)
    exp = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    json.dump(
        {
            "kind": "ExecCredential",
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "spec": {"interactive": False},
            # the token names the account, as a real one identifies its principal to the API
            # server: the simulator records who made each request (several replicas, one cluster)
            "status": {"token": f"{token}.{_b64(os.environ['CLOUDSDK_CORE_ACCOUNT'])}",
                       "expirationTimestamp": exp.strftime("%Y-%m-%dT%H:%M:%SZ")},
        },
        sys.stdout,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
