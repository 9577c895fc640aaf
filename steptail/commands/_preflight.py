"""The pre-flight `follow` and `archive` share before either touches the cluster or the store:
safe names, an account, kubectl on PATH, a kubeconfig that loads, a store that opens and runs
that belong to this JobSet. The first check that fails is one line and exit 2; nothing has
been started, read or written."""

from __future__ import annotations

import shutil

from steptail.commands._common import fail, store_or_exit
from steptail.storage.db import Store


def cluster_target(namespace: str, kubeconfig: str | None, context: str | None, account: str | None,
                   names: tuple[str | None, ...] = ()):
    """The KubeTarget to read from, once its names, account, kubectl and kubeconfig check out."""
    from steptail.collector.cluster.kubeclient import KubeconfigError
    from steptail.collector.cluster.kubeclient import check as check_kubeconfig
    from steptail.collector.cluster.kubectl import AccountMissing, KubeTarget, resolve_account
    from steptail.runs.names import RunNameError, check_cluster_name, check_run_name

    try:
        for name in names:
            if name:
                check_run_name(name)  # a run and a folder name too
        check_cluster_name("namespace", namespace)
        acct = resolve_account(account, kubeconfig)
    except (RunNameError, AccountMissing) as exc:
        fail(str(exc))
    if shutil.which("kubectl") is None:
        fail("kubectl not found on PATH")
    target = KubeTarget(namespace, acct, kubeconfig, context)
    try:  # a missing or invalid kubeconfig, an unknown context
        check_kubeconfig(target)
    except KubeconfigError as exc:
        fail(str(exc))
    return target


def checked_store(db: str | None, namespace: str, runs: dict[str, str], append: bool) -> Store:
    """The store, open, with each run (run -> its JobSet) free for this JobSet's logs: a run
    that holds another source's data is refused unless `append`."""
    from steptail.storage.sources import SourceConflict, check_runs, kubernetes_source

    store = store_or_exit(db)
    try:
        check_runs(store, {run: kubernetes_source(namespace, jobset) for run, jobset in runs.items()},
                   append=append)
    except SourceConflict as exc:
        store.dispose()
        fail(str(exc))
    return store
