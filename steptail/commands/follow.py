"""`steptail follow`: stream process 0 of live JobSets into the store."""

from __future__ import annotations

import asyncio
import shutil

import click

from steptail.commands._common import db_option, fail, store_or_exit
from steptail.commands._detect_options import detector_options, detector_settings
from steptail.commands._webhooks import read_webhooks, webhook_file_option
from steptail.output import Output, output_option


@click.command()
@click.option("--jobset", "jobsets", multiple=True, metavar="NAME", help="JobSet to follow (repeatable).")
@click.option("-n", "--namespace", default="default", show_default=True)
@click.option("--kubeconfig", type=click.Path(dir_okay=False), help="Passed to kubectl and the API client.")
@click.option("--context", help="kubeconfig context.")
@click.option("--account", help="Service account for kubectl's auth plugin (else $CLOUDSDK_CORE_ACCOUNT).")
@click.option("--run", "run_name", help="Run name (one --jobset only; default: the JobSet name).")
@db_option
@click.option("--parquet", metavar="DIR", help="Also write Parquet: DIR/<table>/run=<run>/part-*.parquet.")
@click.option("--raw", metavar="DIR", type=click.Path(file_okay=False),
              help="Keep every line read (as kubectl printed it) in gzip segments under DIR/<run>/, each "
                   "made durable before the rows it yields commit (for audits and `steptail reparse`).")
@click.option("--until-done", is_flag=True, help="Stop when process 0 of every run completed.")
@click.option("--all", "follow_all", is_flag=True, help="Follow every JobSet in the namespace (see --selector).")
@click.option("--selector", help="With --all: label selector on the JobSets' pods.")
@click.option("--silence", type=float, default=30.0, show_default=True,
              help="Longest a quiet stream goes unchecked. No tuning needed: a stream quieter than its "
                   "own pace (max 2 s, 1.5x its usual interval) is checked against the pod's newest "
                   "line and re-opened only when that line was not delivered (a rotation hang); the "
                   "checks back off up to this while the container stays quiet.")
@click.option("--parquet-every", type=float, default=30.0, show_default=True,
              help="Seconds between Parquet flushes (and at shutdown).")
@click.option("--alert-webhook", "webhooks", multiple=True, metavar="URL",
              help="POST findings here (repeatable). Visible in `ps`: prefer --alert-webhook-file.")
@webhook_file_option
@click.option("--metrics-port", type=int, help="Serve Prometheus metrics on PORT.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address of the metrics server.")
@click.option("--duration", type=float, help="Stop after this many seconds.")
@click.option("--no-view", is_flag=True, help="No live table (default when stdout is not a terminal).")
@click.option("--append", is_flag=True,
              help="Follow into a run that holds data of another source (e.g. this run's saved logs, "
                   "ingested earlier) as the same run. Without it such a run is refused: --jobset exits 2, "
                   "--all skips that run.")
@click.option("--give-up", type=float, default=30.0, show_default=True,
              help="Seconds the pod list may be refused (401/403) or the API unreachable from start-up "
                   "before follow exits 2 (a configuration error). Later failures are retried, never fatal.")
@click.option("--max-runs", type=click.IntRange(min=1), default=100, show_default=True,
              help="With --all: most runs this collector follows; JobSets found beyond are not followed "
                   "(one log line, counted in steptail_errors_total{reason=\"max_runs\"}).")
@click.option("--list-page-size", type=click.IntRange(min=1, max=10_000), default=500, show_default=True,
              help="Pods read per list request (the API's limit/continue): memory stays flat in namespace size.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="stderr as text, or one JSON object per line with `severity` (for Cloud Logging).")
@detector_options
@output_option()
def command(jobsets, namespace, kubeconfig, context, account, run_name, db, parquet, raw, until_done, follow_all,
            selector, silence, parquet_every, webhooks, webhook_file, metrics_port, metrics_host, duration, no_view, append,
            give_up, max_runs, list_page_size, log_format, reference_ce, gate_tolerance, resume_tolerance, stall_k, output: Output) -> None:
    """Follow JAX process 0 of JobSets with `kubectl logs -f`, surviving rotation hangs, EOFs,
    JobSet and container restarts and auth lapses; rows committed within ~0.1 s, stream gaps
    and findings recorded. SIGTERM/SIGINT: flush, commit, stop every kubectl.

    -o ndjson streams one JSON object per line as it happens: each committed step (and
    REQUIRED_RBF row), stream gap and finding, each follower state change, and the summary
    last (`event`: step, rbf, gap, finding, state, summary)."""
    from steptail import logs
    from steptail.collector.cluster.kubeclient import KubeconfigError
    from steptail.collector.cluster.kubeclient import check as check_kubeconfig
    from steptail.collector.cluster.kubectl import AccountMissing, KubeTarget, resolve_account
    from steptail.collector.live.follower import FollowConfig
    from steptail.collector.live.supervisor import Plan
    from steptail.collector.live.view import by_kind, summary
    from steptail.collector.live.wiring import follow
    from steptail.runs.names import RunNameError, check_cluster_name, check_run_name
    from steptail.storage.replicas import SqliteFollowLock, StoreBusy
    from steptail.storage.sources import SourceConflict, check_runs, kubernetes_source

    logs.configure(log_format)  # first: every line after this one is in that format
    if not jobsets and not follow_all:
        fail("give --jobset NAME (repeatable) or --all")
    if jobsets and follow_all:
        fail("--jobset and --all exclude each other")
    if selector and not follow_all:
        fail("--selector needs --all")
    if run_name and len(jobsets) != 1:
        fail("--run needs exactly one --jobset")
    if silence <= 0 or parquet_every <= 0:
        fail("--silence and --parquet-every must be positive")
    webhooks = read_webhooks(webhooks, webhook_file)
    if give_up <= 0:
        fail("--give-up must be positive")
    try:
        for name in (run_name, *jobsets):
            if name:
                check_run_name(name)
        check_cluster_name("namespace", namespace)
        acct = resolve_account(account)
    except (RunNameError, AccountMissing) as exc:
        fail(str(exc))
    settings, reference = detector_settings(reference_ce, gate_tolerance, resume_tolerance, stall_k)
    if raw is not None:  # a directory the segments cannot go to: one line now, not a retried outage
        import os

        try:
            os.makedirs(raw, exist_ok=True)
            if not os.access(raw, os.W_OK | os.X_OK):
                raise PermissionError(13, "Permission denied")
        except OSError as exc:
            fail(f"cannot write the raw log under {raw}: {exc.strerror or exc}")
    if shutil.which("kubectl") is None:
        fail("kubectl not found on PATH")
    try:  # a missing or invalid kubeconfig, an unknown context: one line now, nothing started
        check_kubeconfig(KubeTarget(namespace, acct, kubeconfig, context))
    except KubeconfigError as exc:
        fail(str(exc))
    store = store_or_exit(db)
    single = SqliteFollowLock(store.engine.url.database) if store.is_sqlite and store.engine.url.database \
        not in (None, "", ":memory:") else None
    try:  # SQLite has one writer: a second follow of the same file is refused (replicas: PostgreSQL)
        if single is not None:
            single.acquire()
    except StoreBusy as exc:
        store.dispose()
        fail(str(exc))
    try:  # a named JobSet clashing with another source's run: refused before anything starts
        check_runs(store, {(run_name or j): kubernetes_source(namespace, j) for j in jobsets}, append=append)
    except SourceConflict as exc:
        store.dispose()
        fail(str(exc))
    target = KubeTarget(namespace, acct, kubeconfig, context)
    started = []  # the Supervisor, once running

    def stream(event: dict) -> None:
        output.event(event)
        if output.closed and started:  # the reader went away (jq quit): stop as on SIGTERM
            started[0].stop()

    plan = Plan(
        target,
        jobsets={j: (run_name or j) for j in jobsets},
        follow_all=follow_all,
        selector=selector,
        parquet=parquet,
        config=FollowConfig(silence=silence, until_done=until_done, parquet_every=parquet_every, raw=raw),
        settings=settings,
        reference_ce=reference,
        append=append,
        give_up=give_up,
        max_runs=max_runs,
        page_size=list_page_size,
        on_event=stream if output.format == "ndjson" else None,
    )
    console = output.console
    view = console.is_terminal and not no_view and not output.machine
    try:
        sup = asyncio.run(follow(store, plan, view=view, webhooks=webhooks, metrics_port=metrics_port,
                                 metrics_host=metrics_host, duration=duration, console=console,
                                 on_start=lambda s, _url: started.append(s)))
    except OSError as exc:
        fail(f"cannot start: {exc}")
    finally:
        store.dispose()
        if single is not None:
            single.release()
    if sup.fatal:
        fail(sup.fatal)
    report = summary(sup.status, sup.discovery.health, sup.ownership_health)
    # what the cluster sent that was not followed: unsafe names (never a run), JobSets over --max-runs
    report["discovery"] |= {"refused": [{"name": k, "reason": v} for k, v in sup.discovery.refused.items()],
                            "refused_count": sup.discovery.refused_count, "over_max_runs": sup.over_max_runs}
    if output.format == "ndjson":
        output.event({"event": "summary", **report})
        return
    if output.machine:
        output.data(report, report["runs"])
        return
    for r in report["runs"]:
        output.print(f"[bold]{r['run']}[/]: {r['state']}, last step {r['last_step']}, {r['rows']} rows, "
                     f"{r['reconnects']} reconnects, {r['gaps']} stream gaps, {r['failures']} failures"
                     + (f" ({by_kind(r['errors'])})" if r["errors"] else "")
                     + (f" (last: {r['last_error']})" if r["last_error"] else ""), highlight=False, soft_wrap=True)
    d = report["discovery"]
    if d["refused_count"] or d["over_max_runs"]:
        output.print(f"[bold]pod discovery[/]: {d['refused_count']} names refused (unsafe), "
                     f"{d['over_max_runs']} JobSets over --max-runs={max_runs}: not followed",
                     highlight=False, soft_wrap=True)
    for key, name in (("discovery", "pod discovery"), ("ownership", "ownership connection")):
        d = report.get(key)
        if d and d["failures"]:
            output.print(f"[bold]{name}[/]: {d['state']}, {d['failures']} failures ({by_kind(d['errors'])}) "
                         f"(last: {d['last_error']})", highlight=False, soft_wrap=True)
